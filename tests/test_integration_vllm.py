"""The vLLM plugin on the CPU, with a signature-faithful stand-in for vLLM's GDN layer module (vLLM
itself does not install here): the entry point is declared and does nothing without the switch;
with it, the layer module's packed decode is replaced; a call with vLLM's exact arguments (Qwen3-Next
at TP 4: a/b split out of one ba row, an fp32 pool that is a view into larger cache pages, `out` a
slice of the layer's output buffer) writes kdispatch's results (the reference on the CPU) into
`out` and the pool; calls the definitions do not cover reach vLLM's function unchanged."""
import importlib.metadata
import sys
import types

import pytest
import torch

from kdispatch import registry
from kdispatch.integrations import vllm as plugin
from kdispatch.workloads import materialize

LAYER = plugin.LAYER_MODULES[0]


@pytest.fixture
def fake_vllm(monkeypatch):
    """vLLM's layer module path with a packed decode of vLLM's signature that records its calls."""
    calls = []

    def fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                                                        ssm_state_indices, use_qk_l2norm_in_kernel=False):
        calls.append(initial_state.dtype)
        return out, initial_state

    parts = LAYER.split(".")
    for i in range(1, len(parts) + 1):
        mod = types.ModuleType(".".join(parts[:i]))
        mod.__path__ = []
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    sys.modules[LAYER].fused_recurrent_gated_delta_rule_packed_decode = fused_recurrent_gated_delta_rule_packed_decode
    monkeypatch.setattr(plugin, "_original", None)
    yield sys.modules[LAYER], calls


def vllm_call(batch=5, slots=8):
    w = {"axes": {"batch_size": batch, "num_slots": slots}, "inputs": {}, "uuid": f"vllm-{batch}"}
    mixed_qkv, a, b, A_log, dt_bias, pool, idx, _, scale = materialize("gdn_decode_packed_qk4_v8", w)
    ba = torch.cat([b, a], dim=1)
    slot = pool[0].numel()
    pages = torch.zeros(slots, slot + 1024)
    pages[:, :slot] = pool.reshape(slots, -1)
    state = pages.as_strided(pool.shape, (slot + 1024, *pool.stride()[1:]))
    core_attn_out = torch.full((batch + 3, 8, 128), float("nan"), dtype=torch.bfloat16)
    kw = dict(mixed_qkv=mixed_qkv, a=ba[:, 8:], b=ba[:, :8], A_log=A_log, dt_bias=dt_bias, scale=scale,
              initial_state=state, out=core_attn_out[:batch].unsqueeze(1), ssm_state_indices=idx,
              use_qk_l2norm_in_kernel=True)
    return kw, pool


def test_the_entry_point_is_declared_and_off_by_default(monkeypatch, fake_vllm):
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(ep.value == "kdispatch.integrations.vllm:register" for ep in eps)
    monkeypatch.delenv(plugin.SWITCH, raising=False)
    module, _ = fake_vllm
    assert plugin.register() is None
    assert module.fused_recurrent_gated_delta_rule_packed_decode is not plugin.packed_decode_call


def test_vllm_decode_is_served_by_kdispatch(monkeypatch, fake_vllm):
    module, calls = fake_vllm
    monkeypatch.setenv(plugin.SWITCH, "1")
    assert plugin.register() == LAYER
    assert module.fused_recurrent_gated_delta_rule_packed_decode is plugin.packed_decode_call
    kw, pool = vllm_call()
    want_out, want_pool = registry.get("gdn_decode_packed_qk4_v8", "reference").fn(
        kw["mixed_qkv"], kw["a"].contiguous(), kw["b"].contiguous(), kw["A_log"], kw["dt_bias"], pool.clone(),
        kw["ssm_state_indices"], torch.empty(5, 1, 8, 128, dtype=torch.bfloat16), kw["scale"])
    served = plugin.STATS["served"]
    out, state = module.fused_recurrent_gated_delta_rule_packed_decode(**kw)
    assert plugin.STATS["served"] == served + 1 and calls == []
    assert out is kw["out"] and state is kw["initial_state"]
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(state, want_pool, rtol=0, atol=0)


def test_uncovered_calls_reach_vllms_kernel(monkeypatch, fake_vllm):
    module, calls = fake_vllm
    monkeypatch.setenv(plugin.SWITCH, "1")
    plugin.register()
    kw, _ = vllm_call()
    module.fused_recurrent_gated_delta_rule_packed_decode(**{**kw, "initial_state": kw["initial_state"].to(torch.bfloat16)})
    module.fused_recurrent_gated_delta_rule_packed_decode(**{**kw, "use_qk_l2norm_in_kernel": False})
    assert calls == [torch.bfloat16, torch.float32]
