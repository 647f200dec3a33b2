"""The SGLang plugin on the CPU with SGLang itself (0.5.23, installed with --no-deps by .ci/run; the
tests skip where it is missing): the entry point registers its hook only with the switch, SGLang's
HookRegistry applies it to TritonGDNKernel.packed_decode, and a call with SGLang's exact arguments
(Qwen3-Next at TP 4: mixed_qkv [B, 2048], a/b [B, 8], an fp32 pool, int32 slots with -1 padding)
returns SGLang's layout with kdispatch's results (the reference on the CPU) and updates the pool;
calls the definitions do not cover go to SGLang's kernel."""
import importlib.metadata

import pytest
import torch

hook_registry = pytest.importorskip("sglang.srt.plugins.hook_registry")
gdn_triton = pytest.importorskip("sglang.srt.layers.attention.linear.kernels.gdn_triton")

from kdispatch import registry  # noqa: E402
from kdispatch.integrations import packed_decode  # noqa: E402
from kdispatch.integrations import sglang as plugin  # noqa: E402
from kdispatch.workloads import materialize  # noqa: E402


def sglang_call(batch=6, slots=9, seed=0):
    """SGLang's packed_decode keyword arguments for Qwen3-Next at TP 4, and kdispatch's argument tuple."""
    w = {"axes": {"batch_size": batch, "num_slots": slots}, "inputs": {}, "uuid": f"sglang-{batch}"}
    mixed_qkv, a, b, A_log, dt_bias, pool, idx, out, scale = materialize("gdn_decode_packed_qk4_v8", w, seed=seed)
    idx[1] = -1  # a CUDA-graph padding row
    kw = dict(A_log=A_log.to(torch.bfloat16), dt_bias=dt_bias, scale=scale, ssm_states=pool, cache_indices=idx,
              num_v_heads=8, head_v_dim=128)
    return (mixed_qkv, a, b), kw


@pytest.fixture
def hooked(monkeypatch):
    """SGLang's kernel class with kdispatch's hook applied through SGLang's own registry; undone after."""
    cls = gdn_triton.TritonGDNKernel
    original = cls.__dict__["packed_decode"]
    monkeypatch.setenv(plugin.SWITCH, "1")
    hook_registry.HookRegistry.reset()
    assert plugin.register()
    hook_registry.HookRegistry.apply_hooks()
    assert cls.__dict__["packed_decode"] is not original
    yield cls
    cls.packed_decode = original
    hook_registry.HookRegistry.reset()


def test_the_entry_point_is_declared_and_off_by_default(monkeypatch):
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    assert any(ep.value == "kdispatch.integrations.sglang:register" for ep in eps)
    monkeypatch.delenv(plugin.SWITCH, raising=False)
    hook_registry.HookRegistry.reset()
    assert plugin.register() is False
    assert plugin.TARGET not in hook_registry.HookRegistry._hooks


def test_sglang_decode_is_served_by_kdispatch(hooked):
    args, kw = sglang_call()
    pool_before = kw["ssm_states"].clone()
    ref_args = [*args, kw["A_log"].float(), kw["dt_bias"], pool_before.clone(), kw["cache_indices"],
                torch.empty(6, 1, 8, 128, dtype=torch.bfloat16), kw["scale"]]
    want_out, want_pool = registry.get("gdn_decode_packed_qk4_v8", "reference").fn(*ref_args)
    served = plugin.STATS["served"]
    got = hooked().packed_decode(*args, **kw)
    assert plugin.STATS["served"] == served + 1
    assert got.shape == (1, 6, 8, 128)  # SGLang's layout: [1, B, HV, V]
    torch.testing.assert_close(got[0], want_out[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(kw["ssm_states"], want_pool, rtol=0, atol=0)
    assert torch.equal(got[0, 1].float(), torch.zeros(8, 128)), "padding row"


def test_uncovered_calls_go_to_sglangs_kernel():
    args, kw = sglang_call()
    seen = []

    def sglang_kernel(self, *a, **k):
        seen.append(k["ssm_states"].dtype)
        return "sglang"

    kw16 = {**kw, "ssm_states": kw["ssm_states"].to(torch.bfloat16)}
    assert plugin.hook(sglang_kernel, None, *args, **kw16) == "sglang"
    ring = {**kw, "replayssm_d": torch.zeros(1), "replayssm_k": torch.zeros(1), "replayssm_g": torch.zeros(1),
            "replayssm_write_pos": torch.zeros(1)}
    assert plugin.hook(sglang_kernel, None, *args, **ring) == "sglang"
    assert seen == [torch.bfloat16, torch.float32]
    assert packed_decode.not_covered(args[0], args[1], args[2], kw["ssm_states"], kw["cache_indices"], 12, 128) \
        == "12 value heads of 128"
