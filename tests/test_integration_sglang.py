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
from kdispatch.integrations import serving  # noqa: E402
from kdispatch.integrations import sglang as plugin  # noqa: E402
from kdispatch.workloads import materialize  # noqa: E402
from conftest import counted_layout_checks, routed_to_baseline  # noqa: E402


def sglang_call(batch=6, slots=9, seed=0):
    """SGLang's packed_decode keyword arguments for Qwen3-Next at TP 4, and kdispatch's argument tuple."""
    w = {"axes": {"batch_size": batch, "num_slots": slots}, "inputs": {}, "uuid": f"sglang-{batch}"}
    mixed_qkv, a, b, A_log, dt_bias, pool, idx, out, scale = materialize("gdn_decode_packed_qk4_v8", w, seed=seed)
    idx[1] = -1  # a CUDA-graph padding row
    kw = dict(A_log=A_log.to(torch.bfloat16), dt_bias=dt_bias, scale=scale, ssm_states=pool, cache_indices=idx,
              num_v_heads=8, head_v_dim=128)
    return (mixed_qkv, a, b), kw


@pytest.fixture
def kernels_here(monkeypatch):
    """kdispatch takes covered calls, as on a GPU with routers (on the CPU it would run the torch
    reference, so the plugins leave calls to the engine: tests/test_integration_serving.py)."""
    monkeypatch.setattr(serving, "not_served", lambda short, device: None)


@pytest.fixture
def hooked(monkeypatch):
    """SGLang's kernel class with kdispatch's hook applied through SGLang's own registry; undone after."""
    cls = gdn_triton.TritonGDNKernel
    originals = {name: cls.__dict__[name] for name in ("packed_decode", "extend", "target_verify") if name in cls.__dict__}
    monkeypatch.setenv(plugin.SWITCH, "1")
    hook_registry.HookRegistry.reset()
    assert plugin.register()
    hook_registry.HookRegistry.apply_hooks()
    assert cls.__dict__["packed_decode"] is not originals["packed_decode"]
    yield cls
    for name, fn in originals.items():  # every method the registry hooked, not only the one under test
        setattr(cls, name, fn)
    hook_registry.HookRegistry.reset()


def test_the_entry_point_is_declared_and_off_by_default(monkeypatch):
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    assert any(ep.value == "kdispatch.integrations.sglang:register" for ep in eps)
    monkeypatch.delenv(plugin.SWITCH, raising=False)
    hook_registry.HookRegistry.reset()
    assert plugin.register() is False
    assert plugin.TARGET not in hook_registry.HookRegistry._hooks


def test_sglang_decode_is_served_by_kdispatch(hooked, kernels_here):
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


def test_a_covered_decode_layout_is_remembered_and_no_other(monkeypatch):
    """The decode checks run once per layout kdispatch covers; a call differing in any dtype, size
    or stride from every remembered one is checked again."""
    args, kw = sglang_call()
    mixed, a, b = args[0], args[1], args[2]
    pool, slots, hv = kw["ssm_states"], kw["cache_indices"], kw["num_v_heads"]
    checked = counted_layout_checks(monkeypatch, packed_decode, "_layout_not_covered")
    assert packed_decode.not_covered(mixed, a, b, pool, slots, hv, 128) is None
    assert packed_decode.not_covered(mixed.clone(), a.clone(), b.clone(), pool, slots, hv, 128) is None
    assert checked == [1], "the same layout again: not checked again"
    wide = torch.zeros(mixed.shape[0], mixed.shape[1] * 2, dtype=mixed.dtype)[:, ::2]  # last dimension strided
    for call, want in (((wide, a, b, pool, slots), "strided"), ((mixed, a, b, pool.to(torch.bfloat16), slots), "pool"),
                       ((mixed, a, b, pool, slots.long()), "slot indices"), ((mixed, a.float(), b, pool, slots), "gates")):
        assert want in packed_decode.not_covered(*call, hv, 128)
    assert len(checked) == 5


def sglang_extend_call(total=40, seqs=4, slots=7, seed=0):
    """SGLang's extend arguments for Qwen3-Next at TP 4 (q/k [1, T, 4, 128] and v [1, T, 8, 128] as
    views of one projection row, g/beta [1, T, 8] fp32, an fp32 pool, int32 slots and boundaries),
    and kdispatch's argument tuple for the same call."""
    w = {"axes": {"total_seq_len": total, "num_seqs": seqs, "num_slots": slots}, "inputs": {},
         "uuid": f"sglang-extend-{total}"}
    q, k, v, g, beta, pool, idx, _, cu, out, scale = materialize("gdn_prefill_pool_qk4_v8", w, seed=seed)
    idx[2] = -1  # a padding sequence
    row = torch.cat([q.reshape(total, -1), k.reshape(total, -1), v.reshape(total, -1)], dim=1)
    qs, ks, vs = row.split([512, 512, 1024], dim=1)
    sg = (qs.view(1, total, 4, 128), ks.view(1, total, 4, 128), vs.view(1, total, 8, 128), g[None], beta[None])
    kw = dict(ssm_states=pool, cache_indices=idx, query_start_loc=cu, state_checkpoint_cu_starts=None,
              num_state_checkpoints=0, state_checkpoint_every_n_tokens=0, output=torch.full((1, total, 8, 128),
              float("nan"), dtype=torch.bfloat16), layer_id=0, extend_prefix_lens=None, track_state=None,
              track_chunk_idx=None)
    ref = [q, k, v, g, beta, pool.clone(), idx, torch.ones(seqs, dtype=torch.bool), cu, out, scale]
    return sg, kw, ref


@pytest.fixture
def all_hooked(monkeypatch):
    """Both kernel classes with every kdispatch hook applied through SGLang's registry; undone after."""
    gdn_flashinfer = pytest.importorskip("sglang.srt.layers.attention.linear.kernels.gdn_flashinfer")
    classes = (gdn_flashinfer.FlashInferGDNKernel, gdn_triton.TritonGDNKernel)
    methods = [(cls, name, cls.__dict__[name]) for cls in classes
               for name in ("extend", "packed_decode", "target_verify") if name in cls.__dict__]
    monkeypatch.setenv(plugin.SWITCH, "1")
    hook_registry.HookRegistry.reset()
    assert plugin.register()
    hook_registry.HookRegistry.apply_hooks()
    hooked = {(cls.__name__, name) for cls, name, orig in methods if cls.__dict__[name] is not orig}
    assert {("FlashInferGDNKernel", "extend"), ("TritonGDNKernel", "extend"), ("TritonGDNKernel", "packed_decode"),
            ("TritonGDNKernel", "target_verify")} <= hooked
    yield classes
    for cls, name, orig in methods:
        setattr(cls, name, orig)
    hook_registry.HookRegistry.reset()


def test_sglang_extend_is_served_by_kdispatch(all_hooked, kernels_here):
    sg, kw, ref = sglang_extend_call()
    pool_before = ref[5].clone()
    want_out, want_pool = registry.get("gdn_prefill_pool_qk4_v8", "reference").fn(*ref)  # writes ref's pool
    for cls in all_hooked:
        pool = kw["ssm_states"] = pool_before.clone()
        served = plugin.EXTEND_STATS["served"]
        got, last_state, checkpoints = cls.__new__(cls).extend(*sg, **kw)
        assert plugin.EXTEND_STATS["served"] == served + 1
        assert got is kw["output"] and last_state is None and checkpoints is None
        torch.testing.assert_close(got[0], want_out, rtol=0, atol=0)
        torch.testing.assert_close(pool, want_pool, rtol=0, atol=0)
        t0, t1 = int(kw["query_start_loc"][2]), int(kw["query_start_loc"][3])
        assert t1 > t0 and torch.equal(got[0, t0:t1], torch.zeros_like(got[0, t0:t1])), "the padding sequence's rows"


def test_uncovered_extend_calls_go_to_sglangs_kernel():
    sg, kw, _ = sglang_extend_call()
    seen = []

    def sglang_kernel(self, *a, **k):
        seen.append(sorted(k))
        return "sglang"

    assert plugin.extend_hook(sglang_kernel, None, *sg, **{**kw, "num_state_checkpoints": 2}) == "sglang"
    assert plugin.extend_hook(sglang_kernel, None, *sg, **{**kw, "ssm_states": kw["ssm_states"].bfloat16()}) == "sglang"
    assert plugin.extend_hook(sglang_kernel, None, *sg, **{**kw, "query_start_loc": kw["query_start_loc"].long()}) \
        == "sglang"
    assert len(seen) == 3 and plugin.EXTEND_STATS["first_pass_reason"] is not None


def sglang_verify_call(seqs=5, steps=3, seed=0):
    """TritonGDNKernel.target_verify's keyword arguments as SGLang's GDN backend passes them (Qwen3-Next
    at TP 4, q/k/v [1, T, H, 128] views of one projection row, a/b [T, 8] bf16, A_log fp32, dt_bias
    bf16), and kdispatch's argument tuple for the same call."""
    total = seqs * steps
    w = {"axes": {"num_seqs": seqs, "cache_steps": steps, "total_seq_len": total, "num_slots": seqs + 2,
                  "num_cache_rows": seqs}, "inputs": {}, "uuid": f"sglang-verify-{seqs}"}
    q, k, v, a, b, A_log, dt_bias, pool, idx, cu, inter, rows, scale = materialize("gdn_verify_qk4_v8", w, seed=seed)
    idx[1] = -1  # a padding request
    row = torch.cat([q.reshape(total, -1), k.reshape(total, -1), v.reshape(total, -1)], dim=1)
    qs, ks, vs = row.split([512, 512, 1024], dim=1)
    dt16 = dt_bias.to(torch.bfloat16)
    kw = dict(A_log=A_log, dt_bias=dt16, q=qs.view(1, total, 4, 128), k=ks.view(1, total, 4, 128),
              v=vs.view(1, total, 8, 128), a=a, b=b, ssm_states=pool, cache_indices=idx, query_start_loc=cu,
              intermediate_states_buffer=inter, intermediate_state_indices=rows, cache_steps=steps,
              retrieve_parent_token=None, stable_rows=False)
    ref = [q, k, v, a, b, A_log, dt16.float(), pool.clone(), idx, cu, inter.clone(), rows, scale]
    return kw, ref


def test_sglang_verify_is_served_by_kdispatch(all_hooked, kernels_here):
    cls = gdn_triton.TritonGDNKernel
    kw, ref = sglang_verify_call()
    want_out, want_inter = registry.get("gdn_verify_qk4_v8", "reference").fn(*ref)
    pool_before = kw["ssm_states"].clone()
    served = plugin.VERIFY_STATS["served"]
    got = cls.__new__(cls).target_verify(**kw)
    assert plugin.VERIFY_STATS["served"] == served + 1
    assert got.shape == (1, 15, 8, 128)
    torch.testing.assert_close(got[0], want_out, rtol=0, atol=0)
    torch.testing.assert_close(kw["intermediate_states_buffer"], want_inter, rtol=0, atol=0)
    assert torch.equal(kw["ssm_states"], pool_before), "verify never writes the pool"


def test_a_covered_verify_layout_is_remembered_and_no_other(monkeypatch):
    from kdispatch.integrations import verify

    kw, _ = sglang_verify_call()
    q, k, v = (kw[n][0] for n in ("q", "k", "v"))
    a, b, pool, buffer, rows = kw["a"], kw["b"], kw["ssm_states"], kw["intermediate_states_buffer"], \
        kw["intermediate_state_indices"]
    slots, cu = kw["cache_indices"], kw["query_start_loc"]
    checked = counted_layout_checks(monkeypatch, verify, "_layout_not_covered")
    for _ in range(2):
        assert verify.not_covered(q, k, v, a, b, pool, slots, cu, buffer, rows) is None
    assert checked == [1], "checked once for the layout"
    assert "int32" in verify.not_covered(q, k, v, a, b, pool, slots.long(), cu, buffer, rows)
    assert "buffer" in verify.not_covered(q, k, v, a, b, pool, slots, cu, buffer.to(torch.bfloat16), rows)
    assert "buffer" in verify.not_covered(q, k, v, a, b, pool, slots, cu, None, rows)


def test_draft_trees_go_to_sglangs_verify_kernel():
    kw, _ = sglang_verify_call()
    seen = []

    def sglang_kernel(self, *a, **k):
        seen.append(k["retrieve_parent_token"])
        return "sglang"

    tree = torch.zeros(5, 3, dtype=torch.int64)
    args = [kw.pop(n) for n in ("A_log", "dt_bias", "q", "k", "v", "a", "b")]
    assert plugin.verify_hook(sglang_kernel, None, *args, **{**kw, "retrieve_parent_token": tree}) == "sglang"
    assert plugin.verify_hook(sglang_kernel, None, *args, **{**kw, "intermediate_states_buffer": None}) == "sglang"
    assert len(seen) == 2 and seen[0] is tree


def test_verify_shapes_routed_to_the_baseline_go_to_sglangs_kernel(kernels_here, monkeypatch):
    """Where the router names the baseline (SGLang's own kernel behind kdispatch's guard), the hook calls
    SGLang's kernel as SGLang does: the guard and kdispatch's wrapper never run."""
    from kdispatch.integrations import verify

    d, _ = routed_to_baseline(monkeypatch, "gdn_verify_qk4_v8", "sglang_verify")
    monkeypatch.setattr(verify, "not_covered", lambda *a: pytest.fail("the call was prepared for kdispatch"))
    kw, _ = sglang_verify_call()
    args = [kw.pop(n) for n in ("A_log", "dt_bias", "q", "k", "v", "a", "b")]
    passed = plugin.VERIFY_STATS["passed"]
    assert plugin.verify_hook(lambda self, *a, **k: "sglang", None, *args, **kw) == "sglang"
    assert plugin.VERIFY_STATS["passed"] == passed + 1
    d.reset()


def test_extend_shapes_routed_to_the_baseline_go_to_sglangs_kernel_first(kernels_here, monkeypatch):
    """An extend call the router gives back (SGLang's FlashInfer path measured fastest there) is asked
    before kdispatch's views and checks are built: SGLang's kernel gets it for a few microseconds of
    host time (prefill brings a new token count nearly every call, so no decision is cached)."""
    from kdispatch.integrations import pool_prefill

    d, asked = routed_to_baseline(monkeypatch, "gdn_prefill_pool_qk4_v8", "sglang_flashinfer_prefill")
    monkeypatch.setattr(pool_prefill, "not_covered", lambda *a: pytest.fail("the call was prepared for kdispatch"))
    sg, kw, _ = sglang_extend_call(total=40, seqs=4, slots=7)
    passed = plugin.EXTEND_STATS["passed"]
    for _ in range(2):
        assert plugin.extend_hook(lambda self, *a, **k: "sglang", None, *sg, **kw) == "sglang"
    assert plugin.EXTEND_STATS["passed"] == passed + 2
    assert asked == [{"total_seq_len": 40, "num_seqs": 4, "len_cu_seqlens": 5, "num_slots": 7}], \
        "asked once: the second call's answer is remembered"
    assert list(asked[0]) == d.checker.var_axes, "the definition's variable axes, as its router takes them"
    d.reset()


def test_extend_is_routed_with_the_batchs_longest_sequence(kernels_here, monkeypatch):
    """The metadata hook notes the forward batch's longest extend length (host side); the extend call
    of a batch with as many sequences is routed with it as max_seq_len, another batch's without."""
    from types import SimpleNamespace

    from kdispatch.integrations import pool_prefill

    d, asked = routed_to_baseline(monkeypatch, "gdn_prefill_pool_qk4_v8", "sglang_flashinfer_prefill")
    monkeypatch.setattr(pool_prefill, "not_covered", lambda *a: pytest.fail("the call was prepared for kdispatch"))
    sg, kw, _ = sglang_extend_call(total=40, seqs=4, slots=7)
    for lens, want in (([3, 30, 2, 5], 30), ([20, 20], None)):
        assert plugin.note_lengths(None, SimpleNamespace(extend_seq_lens_cpu=lens)) is None, "changes no argument"
        assert plugin.extend_hook(lambda self, *a, **k: "sglang", None, *sg, **kw) == "sglang"
        assert asked[-1].get("max_seq_len") == want
    d.reset()
    # the hooked method exists where the target says (its module needs more of SGLang than the tests import)
    import ast
    import importlib.util

    module, cls, method = plugin.METADATA_TARGET.rsplit(".", 2)
    tree = ast.parse(open(importlib.util.find_spec(module).origin).read())
    assert any(isinstance(c, ast.ClassDef) and c.name == cls and any(
        isinstance(f, ast.FunctionDef) and f.name == method for f in c.body) for c in tree.body)


def test_decode_shapes_routed_to_the_baseline_go_to_sglangs_kernel_first(kernels_here, monkeypatch):
    """A packed-decode call the router gives back (SGLang's kernel measured fastest there) goes to
    SGLang's kernel before kdispatch's output buffer, float32 gates and checks are built, and the
    answer is asked once per shape (H100, 2026-11-26: 32 value heads x 256 requests, handed back
    eagerly, took 31 us more host time than SGLang's own call when built first)."""
    d, asked = routed_to_baseline(monkeypatch, "gdn_decode_packed_qk4_v8", "sglang_packed_decode")
    monkeypatch.setattr(packed_decode, "not_covered", lambda *a: pytest.fail("the call was prepared for kdispatch"))
    args, kw = sglang_call(batch=6, slots=9)
    passed = plugin.STATS["passed"]
    for _ in range(2):
        assert plugin.hook(lambda self, *a, **k: "sglang", None, *args, **kw) == "sglang"
    assert plugin.STATS["passed"] == passed + 2
    assert asked == [{"batch_size": 6, "num_slots": 9}], "asked once: the second call's answer is remembered"
    assert list(asked[0]) == d.checker.var_axes, "the definition's variable axes, as its router takes them"
    d.reset()
