"""The vLLM plugin on the CPU, with a signature-faithful stand-in for vLLM's GDN layer module (vLLM
itself does not install here): the entry point is declared and does nothing without the switch;
with it, the layer module's packed decode and sigmoid-gating kernel are replaced; calls with vLLM's
exact arguments (Qwen3-Next at TP 4: a/b split out of one ba row, an fp32 pool that is a view into
larger cache pages, `out` a slice of the layer's output buffer; for verification the step slots a
slice of a CUDA-graph bucket's block table; for prefill the states gathered per sequence, fp32 or
bf16) give kdispatch's results (the reference on the CPU); calls the definitions do not cover
reach vLLM's functions unchanged."""
import importlib.metadata
import logging
import sys
import types

import pytest
import torch

from kdispatch import registry
from kdispatch.integrations import serving
from kdispatch.integrations import vllm as plugin
from kdispatch.workloads import materialize

from conftest import counted_layout_checks, routed_to_baseline

LAYER = plugin.LAYER_MODULES[0]


@pytest.fixture
def kernels_here(monkeypatch):
    """kdispatch takes covered calls, as on a GPU with routers (on the CPU it would run the torch
    reference, so the plugins leave calls to the engine: tests/test_integration_serving.py)."""
    monkeypatch.setattr(serving, "not_served", lambda short, device: None)


@pytest.fixture
def fake_vllm(monkeypatch):
    """vLLM's layer module path with a packed decode of vLLM's signature that records its calls."""
    calls = []

    def fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                                                        ssm_state_indices, use_qk_l2norm_in_kernel=False):
        calls.append(initial_state.dtype)
        return out, initial_state

    def fused_sigmoid_gating_delta_rule_update(A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None,
                                               initial_state=None, inplace_final_state=True, cu_seqlens=None,
                                               ssm_state_indices=None, num_accepted_tokens=None,
                                               use_qk_l2norm_in_kernel=False, is_kda=False):
        calls.append(("sigmoid_gating", None if ssm_state_indices is None else ssm_state_indices.dim()))
        return q.new_empty(1, *v.shape[1:]), initial_state

    def fi_chunk_gated_delta_rule(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None,
                                  use_qk_l2norm_in_kernel=True, state_checkpoints=None, checkpoint_cu_starts=None,
                                  checkpoint_every_n_tokens=0, use_cp="auto"):
        calls.append(("fi", initial_state.dtype))
        torch.exp(g)  # as vLLM <= 0.33, which takes the log decay and exponentiates it for FlashInfer
        return v.new_empty(v.shape), initial_state.float()

    def fla_chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                                   cu_seqlens=None, chunk_indices=None, chunk_offsets=None,
                                   use_qk_l2norm_in_kernel=False, core_attn_out=None):
        calls.append(("fla", initial_state.dtype))
        return v.new_empty(v.shape), initial_state.float()

    parts = LAYER.split(".")
    for i in range(1, len(parts) + 1):
        mod = types.ModuleType(".".join(parts[:i]))
        mod.__path__ = []
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    sys.modules[LAYER].fused_recurrent_gated_delta_rule_packed_decode = fused_recurrent_gated_delta_rule_packed_decode
    sys.modules[LAYER].fused_sigmoid_gating_delta_rule_update = fused_sigmoid_gating_delta_rule_update
    sys.modules[LAYER].fi_chunk_gated_delta_rule = fi_chunk_gated_delta_rule
    sys.modules[LAYER].fla_chunk_gated_delta_rule = fla_chunk_gated_delta_rule
    monkeypatch.setattr(plugin, "_originals", {})
    from kdispatch.integrations import pool_prefill

    monkeypatch.setitem(pool_prefill._batch, "lengths", None)
    yield sys.modules[LAYER], calls


@pytest.fixture
def fake_builder(monkeypatch):
    """vLLM's GDN metadata builder class at its module path, its `build` with vLLM's signature."""
    module_name, cls_name = plugin.METADATA_BUILDER.rsplit(".", 1)
    parts = module_name.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules or i == len(parts):
            mod = types.ModuleType(name)
            mod.__path__ = []
            monkeypatch.setitem(sys.modules, name, mod)

    class Builder:
        def build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens=None,
                  num_decode_draft_tokens_cpu=None, fast_build=False):
            return types.SimpleNamespace(num_prefills=common_attn_metadata.prefills)

    setattr(sys.modules[module_name], cls_name, Builder)
    return Builder


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


def test_vllm_decode_is_served_by_kdispatch(monkeypatch, fake_vllm, kernels_here):
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


def test_decode_shapes_routed_to_the_baseline_reach_vllms_kernel_first(monkeypatch, fake_vllm, kernels_here):
    """A packed-decode call the router gives back goes to vLLM's kernel before kdispatch's checks and
    float32 gates are built; the answer is asked once per shape."""
    from kdispatch.integrations import packed_decode

    module, calls = fake_vllm
    monkeypatch.setenv(plugin.SWITCH, "1")
    plugin.register()
    d, asked = routed_to_baseline(monkeypatch, "gdn_decode_packed_qk4_v8", "sglang_packed_decode")
    monkeypatch.setattr(packed_decode, "not_covered", lambda *a: pytest.fail("the call was prepared for kdispatch"))
    kw, _ = vllm_call(batch=5, slots=8)
    for _ in range(2):
        module.fused_recurrent_gated_delta_rule_packed_decode(**kw)
    assert calls == [torch.float32] * 2
    assert asked == [{"batch_size": 5, "num_slots": 8}], "asked once: the second call's answer is remembered"
    d.reset()


def vllm_verify_call(seqs=5, steps=3, bucket=8):
    """fused_sigmoid_gating_delta_rule_update's keyword arguments as vLLM's spec-decode path passes
    them (q/k/v [1, T, H, 128], a/b [T, 8] bf16, dt_bias bf16, a pool view into cache pages, the step
    slots and accepted counts of a CUDA-graph bucket of `bucket` rows, slots a slice of a wider block
    table), and kdispatch's argument tuple for the same call."""
    total = seqs * steps
    w = {"axes": {"num_seqs": seqs, "num_steps": steps, "total_seq_len": total, "num_slots": total + 1},
         "inputs": {}, "uuid": f"vllm-verify-{seqs}"}
    q, k, v, a, b, A_log, dt_bias, pool, step_slots, accepted, cu, scale = materialize("gdn_verify_steps_qk4_v8", w)
    step_slots[1] = 0  # a padding request (vLLM's null block)
    table = torch.zeros(bucket, steps + 2, dtype=torch.int32)  # the bucket's block table, wider than S
    table[:seqs, :steps] = step_slots
    acc = torch.ones(bucket, dtype=torch.int32)
    acc[:seqs] = accepted
    slot = pool[0].numel()
    pages = torch.zeros(total + 1, slot + 1024)
    pages[:, :slot] = pool.reshape(total + 1, -1)
    state = pages.as_strided(pool.shape, (slot + 1024, *pool.stride()[1:]))
    dt16 = dt_bias.to(torch.bfloat16)
    kw = dict(A_log=A_log, a=a, b=b, dt_bias=dt16, q=q[None], k=k[None], v=v[None], initial_state=state,
              inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=table[:, :steps],
              num_accepted_tokens=acc, use_qk_l2norm_in_kernel=True)
    ref = [q, k, v, a, b, A_log, dt16.float(), pool.clone(), step_slots, accepted, cu, scale]
    return kw, ref


def test_vllm_verify_is_served_by_kdispatch(monkeypatch, fake_vllm, kernels_here):
    module, calls = fake_vllm
    monkeypatch.setenv(plugin.SWITCH, "1")
    plugin.register()
    assert module.fused_sigmoid_gating_delta_rule_update is plugin.sigmoid_gating_call
    kw, ref = vllm_verify_call()
    want_out, want_pool = registry.get("gdn_verify_steps_qk4_v8", "reference").fn(*ref)
    served = plugin.VERIFY_STATS["served"]
    out, state = module.fused_sigmoid_gating_delta_rule_update(**kw)
    assert plugin.VERIFY_STATS["served"] == served + 1 and calls == []
    assert out.shape == (1, 15, 8, 128) and state is kw["initial_state"]
    torch.testing.assert_close(out[0], want_out, rtol=0, atol=0)
    torch.testing.assert_close(state, want_pool, rtol=0, atol=0)
    assert torch.equal(out[0, 3:6], torch.zeros_like(out[0, 3:6])), "the padding request"


def test_decode_and_other_sigmoid_gating_calls_reach_vllm(monkeypatch, fake_vllm):
    module, calls = fake_vllm
    monkeypatch.setenv(plugin.SWITCH, "1")
    plugin.register()
    kw, _ = vllm_verify_call()
    module.fused_sigmoid_gating_delta_rule_update(**{**kw, "ssm_state_indices": kw["ssm_state_indices"][:, 0],
                                                     "num_accepted_tokens": None})  # vLLM's 1-D decode call
    module.fused_sigmoid_gating_delta_rule_update(**{**kw, "initial_state": kw["initial_state"].to(torch.bfloat16)})
    module.fused_sigmoid_gating_delta_rule_update(**kw)  # covered, but no kernel on the CPU: the reference would serve
    assert calls == [("sigmoid_gating", 1), ("sigmoid_gating", 2), ("sigmoid_gating", 2)]
    assert plugin.VERIFY_STATS["first_pass_reason"] is not None


def vllm_prefill_call(seqs=4, total=40, dtype=torch.float32):
    """vLLM's prefill arguments at TP 4 (q/k [1, T, 4, 128] L2-normalised by its post-conv prep, v
    [1, T, 8, 128] a view into the projection row it was split from, g/beta [1, T, 8] fp32, the
    states gathered per sequence and zeroed where a sequence has none, int32 boundaries; fla's call
    adds a flat output buffer longer than the output), and the gdn_prefill_gathered reference's
    argument tuple for the same call (v contiguous)."""
    w = {"axes": {"total_seq_len": total, "num_seqs": seqs, "num_slots": seqs + 1}, "inputs": {},
         "uuid": f"vllm-prefill-{total}"}
    q, k, v, g, beta, pool, idx, _, cu, out, scale = materialize("gdn_prefill_pool_qk4_v8", w, seed=5)
    q, k = (torch.nn.functional.normalize(x.float(), dim=-1).to(torch.bfloat16) for x in (q, k))
    gathered = pool[idx.long()].to(dtype)
    gathered[1] = 0  # a sequence with no initial state, zeroed by vLLM
    mixed = torch.cat([q.reshape(total, -1), k.reshape(total, -1), v.reshape(total, -1)], dim=1)
    v_view = mixed[:, 1024:].view(total, 8, 128)  # as vLLM's split of mixed_qkv leaves it: rows 2,048 wide
    assert not v_view.is_contiguous() and torch.equal(v_view, v)
    kw = dict(q=q[None], k=k[None], v=v_view[None], g=g[None], beta=beta[None], initial_state=gathered,
              output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=False)
    ref = [q, k, v, g, beta, gathered.float().clone(), cu, out, None]
    return kw, ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernel", [plugin.FI_PREFILL, plugin.FLA_PREFILL])
def test_vllm_prefill_is_served_by_kdispatch(monkeypatch, fake_vllm, kernels_here, kernel, dtype):
    module, calls = fake_vllm
    monkeypatch.setenv(plugin.SWITCH, "1")
    monkeypatch.setenv(plugin.PREFILL_SWITCH, "1")
    plugin.register()
    assert getattr(module, kernel) in (plugin.fi_chunk_call, plugin.fla_chunk_call)
    kw, ref = vllm_prefill_call(dtype=dtype)
    want_out, want_states = registry.get("gdn_prefill_gathered_qk4_v8", "reference").fn(*ref)
    buffer = None
    if kernel == plugin.FLA_PREFILL:
        buffer = kw["core_attn_out"] = torch.full((50, 8, 128), float("nan"), dtype=torch.bfloat16)
    served = plugin.PREFILL_STATS["served"]
    out, final = getattr(module, kernel)(**kw)
    assert plugin.PREFILL_STATS["served"] == served + 1 and calls == []
    assert out.shape == (1, 40, 8, 128) and final.shape == (4, 8, 128, 128) and final.dtype == torch.float32
    torch.testing.assert_close(out[0], want_out, rtol=0, atol=0)
    torch.testing.assert_close(final, want_states, rtol=0, atol=0)
    if buffer is not None:
        assert out.data_ptr() == buffer.data_ptr() and torch.isnan(buffer[40:]).all()


def test_a_heads_major_v_gets_a_contiguous_output(monkeypatch, fake_vllm, kernels_here):
    """The output buffer the swap allocates is contiguous whatever v's strides (the CUDA variants
    take a contiguous `out` only, and one that raises is dropped for good): here v is dense but
    heads-major, which `torch.empty_like` alone would copy."""
    module, calls = fake_vllm
    monkeypatch.setenv(plugin.SWITCH, "1")
    monkeypatch.setenv(plugin.PREFILL_SWITCH, "1")
    plugin.register()
    kw, ref = vllm_prefill_call()
    want_out, _ = registry.get("gdn_prefill_gathered_qk4_v8", "reference").fn(*ref)
    v = kw["v"][0].transpose(0, 1).contiguous().transpose(0, 1)
    assert v.stride() == (128, v.shape[0] * 128, 1)
    out, _ = module.fi_chunk_gated_delta_rule(**{**kw, "v": v[None]})
    assert calls == [] and out.is_contiguous()
    torch.testing.assert_close(out[0], want_out, rtol=0, atol=0)


def test_a_covered_prefill_layout_is_checked_once_whatever_the_token_count(monkeypatch):
    """The prefill checks run once per layout kdispatch covers, not once per token count (engines
    prefill a new one nearly every call); the counts themselves are compared on every call."""
    from kdispatch.integrations import pool_prefill

    kw, _ = vllm_prefill_call(seqs=4, total=40)
    q, k, v, g, beta = (kw[n][0] for n in ("q", "k", "v", "g", "beta"))
    states, cu = kw["initial_state"], kw["cu_seqlens"]
    checked = counted_layout_checks(monkeypatch, pool_prefill, "_layout_not_covered")

    def asked(*args, slots=None):
        return pool_prefill.not_covered(*args, slots, cu, plugin.PREFILL_POOL_DTYPES, kind=plugin.PREFILL_KIND)

    assert asked(q, k, v, g, beta, states) is None
    assert asked(q[:24], k[:24], v[:24], g[:24], beta[:24], states[:2]) is None
    assert checked == [1], "another token count and sequence count: the layout is not checked again"
    assert "tokens" in asked(q, k, v[:24], g, beta, states)
    assert "gates" in asked(q, k, v, g.double(), beta, states)
    assert len(checked) == 2


def test_prefill_stays_vllms_without_its_switch(monkeypatch, fake_vllm, fake_builder):
    """KDISPATCH_VLLM alone swaps decode and verification, not prefill, and leaves the metadata
    builder unwrapped."""
    module, _ = fake_vllm
    fi, fla, build = module.fi_chunk_gated_delta_rule, module.fla_chunk_gated_delta_rule, fake_builder.build
    monkeypatch.setenv(plugin.SWITCH, "1")
    monkeypatch.delenv(plugin.PREFILL_SWITCH, raising=False)
    assert plugin.register() == LAYER
    assert module.fused_recurrent_gated_delta_rule_packed_decode is plugin.packed_decode_call
    assert module.fi_chunk_gated_delta_rule is fi and module.fla_chunk_gated_delta_rule is fla
    assert fake_builder.build is build


def test_uncovered_prefill_calls_reach_vllm(monkeypatch, fake_vllm, kernels_here):
    module, calls = fake_vllm
    monkeypatch.setenv(plugin.SWITCH, "1")
    monkeypatch.setenv(plugin.PREFILL_SWITCH, "1")
    plugin.register()
    kw, _ = vllm_prefill_call()
    module.fi_chunk_gated_delta_rule(**kw, state_checkpoints=torch.zeros(1, 8, 128, 128), checkpoint_every_n_tokens=64)
    module.fi_chunk_gated_delta_rule(**{**kw, "initial_state": kw["initial_state"][:3]})  # 3 states, 4 sequences
    module.fla_chunk_gated_delta_rule(**kw, core_attn_out=torch.empty(8, 8, 128, dtype=torch.bfloat16))  # too short
    module.fla_chunk_gated_delta_rule(**{**kw, "initial_state": kw["initial_state"].double()})
    for kernel in (module.fi_chunk_gated_delta_rule, module.fla_chunk_gated_delta_rule):  # q/k left to the kernel to normalise
        kernel(**{**kw, "use_qk_l2norm_in_kernel": True})
    assert calls == [("fi", torch.float32), ("fi", torch.float32), ("fla", torch.float32), ("fla", torch.float64),
                     ("fi", torch.float32), ("fla", torch.float32)]
    assert plugin.PREFILL_STATS["first_pass_reason"] is not None


def test_the_metadata_builder_notes_each_batchs_prefills_and_longest_query(monkeypatch, fake_vllm, fake_builder):
    from kdispatch.integrations import pool_prefill

    monkeypatch.setenv(plugin.SWITCH, "1")
    monkeypatch.setenv(plugin.PREFILL_SWITCH, "1")
    plugin.register()
    plugin.register()  # wrapped once
    common = types.SimpleNamespace(prefills=3, max_query_len=77)
    metadata = fake_builder().build(0, common)
    assert metadata.num_prefills == 3 and pool_prefill.batch_longest(3) == 77 and pool_prefill.batch_longest(2) is None
    fake_builder().build(common_prefix_len=0, common_attn_metadata=types.SimpleNamespace(prefills=0, max_query_len=1))
    assert pool_prefill.batch_longest(0) is None, "a decode-only batch"
    assert not hasattr(fake_builder.build.__wrapped__, "_kdispatch_notes_lengths"), "not wrapped twice"


@pytest.mark.parametrize("kernel", [plugin.FI_PREFILL, plugin.FLA_PREFILL])
def test_prefill_is_routed_with_the_batchs_longest_query(monkeypatch, fake_vllm, kernels_here, kernel):
    """The prefill call of a batch with as many prefills as noted is routed with its longest query as
    max_seq_len, another batch's without; a call the router gives back reaches vLLM's function before
    kdispatch's checks run."""
    from kdispatch.integrations import pool_prefill

    module, calls = fake_vllm
    monkeypatch.setenv(plugin.SWITCH, "1")
    monkeypatch.setenv(plugin.PREFILL_SWITCH, "1")
    plugin.register()
    d, asked = routed_to_baseline(monkeypatch, "gdn_prefill_gathered_qk4_v8", "vllm_flashinfer_prefill")
    monkeypatch.setattr(pool_prefill, "not_covered", lambda *a, **k: pytest.fail("the call was prepared for kdispatch"))
    kw, _ = vllm_prefill_call(seqs=4, total=40)
    for prefills, want in ((4, 30), (2, None)):
        plugin.note_lengths(types.SimpleNamespace(num_prefills=prefills), types.SimpleNamespace(max_query_len=30))
        getattr(module, kernel)(**kw)
        assert asked[-1].get("max_seq_len") == want
    assert [c[0] for c in calls] == [kernel.split("_")[0]] * 2
    d.reset()


def test_the_gathered_views_slot_and_flag_buffers_are_right_after_growing():
    """identity_slots / all_true, slices of buffers that grow and are never freed: each still reads
    0 .. n-1 / all true after a longer buffer replaced the one it was cut from."""
    from kdispatch.definitions.gdn.gathered import all_true, identity_slots

    short = identity_slots(3, torch.device("cpu"))
    long = identity_slots(700, torch.device("cpu"))
    assert short.tolist() == [0, 1, 2] and long.tolist() == list(range(700)) and long.dtype == torch.int32
    assert identity_slots(5, torch.device("cpu")).tolist() == list(range(5))
    flags = all_true(600, torch.device("cpu"))
    assert flags.dtype == torch.bool and flags.shape == (600,) and bool(flags.all())


def _fi_chunk_034(calls):
    """vLLM 0.34's fi_chunk_gated_delta_rule signature: g handed on to FlashInfer as given (exp(g)), an
    `output` buffer."""
    def fi_chunk_gated_delta_rule(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None,
                                  use_qk_l2norm_in_kernel=True, state_checkpoints=None, checkpoint_cu_starts=None,
                                  checkpoint_every_n_tokens=0, use_cp="auto", output=None):
        calls.append(("fi 0.34", g, output))
        return v.new_empty(v.shape), initial_state.float()
    return fi_chunk_gated_delta_rule


def test_vllm_034s_flashinfer_prefill_is_served_on_the_log_of_its_gates(monkeypatch, fake_vllm, kernels_here, caplog):
    """vLLM 0.34 hands fi_chunk_gated_delta_rule exp(g) and an `output` slice of the layer's buffer:
    kdispatch serves the call on log(exp(g)), the output written into the buffer; a gate that
    underflowed to 0 gives no NaN and a state as with a strong decay."""
    module, calls = fake_vllm
    module.fi_chunk_gated_delta_rule = _fi_chunk_034(calls)
    monkeypatch.setenv(plugin.SWITCH, "1")
    monkeypatch.setenv(plugin.PREFILL_SWITCH, "1")
    with caplog.at_level(logging.INFO, logger=plugin.__name__):
        plugin.register()
    assert "takes exp(g) in this vLLM: kdispatch takes its log" in caplog.text
    kw, ref = vllm_prefill_call()
    ref[3][5, 2] = -200.0  # a decay exp(g) underflows: 0 in fp32
    want_out, want_states = registry.get("gdn_prefill_gathered_qk4_v8", "reference").fn(*ref)
    gate = kw["g"].exp()
    assert gate[0, 5, 2] == 0
    # finite where the gate underflowed: the chunked kernels difference cumulative log decays (-inf - -inf)
    assert bool(torch.isfinite(plugin._log_decay(gate)).all())
    buffer = torch.full((40, 8, 128), float("nan"), dtype=torch.bfloat16)
    out, states = module.fi_chunk_gated_delta_rule(**{**kw, "g": gate}, output=buffer)
    assert calls == [] and out.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(buffer, want_out, rtol=1e-2, atol=1e-2)  # bf16 outputs of log(exp(g)), g
    torch.testing.assert_close(states, want_states, rtol=1e-4, atol=1e-4)


def test_vllm_034s_prefill_given_back_reaches_vllm_with_its_gates_as_they_came(monkeypatch, fake_vllm,
                                                                              kernels_here):
    """A 0.34 call its router gives back, or with state checkpoints, reaches vLLM's function with exp(g)
    and `output` untouched; a function whose code cannot be read keeps its calls."""
    module, calls = fake_vllm
    module.fi_chunk_gated_delta_rule = _fi_chunk_034(calls)
    monkeypatch.setenv(plugin.SWITCH, "1")
    monkeypatch.setenv(plugin.PREFILL_SWITCH, "1")
    plugin.register()
    kw, _ = vllm_prefill_call()
    gate, buffer = kw["g"].exp(), torch.empty(40, 8, 128, dtype=torch.bfloat16)
    module.fi_chunk_gated_delta_rule(**{**kw, "g": gate}, output=buffer, state_checkpoints=torch.zeros(1, 8, 128, 128),
                                     checkpoint_every_n_tokens=64)
    d, _ = routed_to_baseline(monkeypatch, "gdn_prefill_gathered_qk4_v8", "vllm_flashinfer_prefill")
    module.fi_chunk_gated_delta_rule(**{**kw, "g": gate}, output=buffer)
    d.reset()
    assert [(c[1] is gate, c[2] is buffer) for c in calls] == [(True, True)] * 2
    assert plugin._gates_taken(torch.exp) is None  # a builtin: no code to read


def test_a_log_gate_prefill_with_an_output_buffer_is_written_there(monkeypatch, fake_vllm, kernels_here):
    """Where vLLM's function takes the log decay and an `output` buffer, kdispatch writes the output there."""
    module, calls = fake_vllm

    def fi_chunk_gated_delta_rule(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None,
                                  use_qk_l2norm_in_kernel=True, state_checkpoints=None, checkpoint_cu_starts=None,
                                  checkpoint_every_n_tokens=0, use_cp="auto", output=None):
        calls.append(("fi", output.shape))
        torch.exp(g)  # takes the log decay
        return v.new_empty(v.shape), initial_state.float()

    module.fi_chunk_gated_delta_rule = fi_chunk_gated_delta_rule
    monkeypatch.setenv(plugin.SWITCH, "1")
    monkeypatch.setenv(plugin.PREFILL_SWITCH, "1")
    plugin.register()
    kw, ref = vllm_prefill_call()
    want_out, _ = registry.get("gdn_prefill_gathered_qk4_v8", "reference").fn(*ref)
    buffer = torch.full((40, 8, 128), float("nan"), dtype=torch.bfloat16)
    out, _ = module.fi_chunk_gated_delta_rule(**kw, output=buffer)
    assert calls == [] and out.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(buffer, want_out, rtol=0, atol=0)
    module.fi_chunk_gated_delta_rule(**kw, output=buffer[:, :4])  # not contiguous: vLLM's
    assert calls == [("fi", (40, 4, 128))]
