"""CPU tests of the `flashinfer_direct` variants, calls of FlashInfer's compiled sm_90 prefill kernel
without its Python layers: the contest prefill's (kernels/library/gdn/flashinfer_direct.py) and the
gathered and pool prefills' (flashinfer_direct_gathered.py, flashinfer_direct_pool.py, through
flashinfer_compiled.py). FlashInfer's sm_90 module is stood in for (no GPU here), and the launches
before it by their contracts on well-formed batches; what is tested is the wrappers' own work: the
readiness probe, the first call of a process through FlashInfer's entry, later ones straight to the
compiled kernel with the entry's views and scalars, one look-up per configuration (a pool's slots
and inner strides), and a cache miss kept to the entry and said once."""
import sys
import types
import warnings

import pytest
import torch

from conftest import kernel_module

X = kernel_module("kdispatch.kernels.library.gdn.flashinfer_direct")
GUARD = kernel_module("kdispatch.kernels.cuda.gdn.prefill_guard")


def fake_sm90(compiled, calls):
    """A stand-in of FlashInfer's sm_90 prefill module: the entry and the compiled kernel record their calls."""
    m = types.ModuleType(X._SM90)
    m.delta_rule_prefill_dsl_sm90 = lambda *a, **kw: calls.append(("entry", a, kw))
    m._get_prefill_kernel = lambda *a, **kw: ("kernel", a, tuple(sorted(kw.items())))
    m._SM90_COMPILE_OPTIONS = ("sm_90a",)
    m.get_cached_compile = lambda kernel, options: compiled
    m._get_cache_buf = lambda name, size, device: torch.empty(size, dtype=torch.uint8)
    m.get_device_sm_count = lambda device: 132
    return m


@pytest.fixture
def cutlass_stub(monkeypatch):
    pytest.importorskip("cuda.bindings.driver")  # the stream handle's type (cuda-python, no GPU needed)
    monkeypatch.setitem(sys.modules, "cutlass", types.SimpleNamespace(BFloat16="bf16"))
    monkeypatch.setattr(X.nvrtc, "current_stream", lambda device=None: 7)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # CPU tensors name no device index


def args(T=10, n=2, hq=4, hv=8, D=128):
    q, k = torch.randn(T, hq, D, dtype=torch.bfloat16), torch.randn(T, hq, D, dtype=torch.bfloat16)
    v = torch.randn(T, hv, D, dtype=torch.bfloat16)
    state = torch.randn(n, hv, D, D)
    a, b = torch.randn(T, hv, dtype=torch.bfloat16), torch.randn(T, hv, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, T], dtype=torch.int32)
    return q, k, v, state, torch.randn(hv), a, torch.randn(hv), b, cu, 0.0


def guard_contract(cu, T, *, gates, out, malformed):
    """prefill_guard.guard on a well-formed batch: int64 boundaries and the activated gates."""
    A_log, a, dt_bias, b = gates
    alpha = torch.exp(-torch.exp(A_log) * torch.nn.functional.softplus(a.float() + dt_bias))
    return cu.to(torch.int64), None, alpha, torch.sigmoid(b.float())


@pytest.mark.parametrize("absent,ready", [((), True), (("_get_prefill_kernel",), False)])
def test_ready_only_where_flashinfer_has_the_internals(monkeypatch, absent, ready):
    m = fake_sm90(None, [])
    for name in absent:
        delattr(m, name)
    monkeypatch.setitem(sys.modules, X._SM90, m)
    answer = X.internals_ready()
    assert (answer is None) == ready
    if not ready:
        assert "_get_prefill_kernel" in answer


def test_not_ready_where_the_module_does_not_import(monkeypatch):
    monkeypatch.setitem(sys.modules, X._SM90, None)  # import raises ImportError
    assert "does not import" in X.internals_ready()


def test_first_call_through_the_entry_then_the_compiled_kernel(monkeypatch, cutlass_stub):
    calls = []
    compiled = lambda *a: calls.append(("compiled", a))  # noqa: E731
    monkeypatch.setitem(sys.modules, X._SM90, fake_sm90(compiled, calls))
    monkeypatch.setattr(GUARD, "guard", guard_contract)
    monkeypatch.setattr(X, "_compiled", {})
    q, k, v, state, *_ = call = args()
    out, new_state = X.gdn_prefill_flashinfer_direct(*call)
    assert [c[0] for c in calls] == ["entry"] and new_state is state
    entry = calls[0][1]
    assert entry[1] is state and entry[5] is state  # final states written over the initial ones
    assert entry[9] == pytest.approx(128 ** -0.5)  # the definition's scale 0: 1/sqrt(head size)
    X.gdn_prefill_flashinfer_direct(*call)
    assert [c[0] for c in calls] == ["entry", "compiled"]
    a = calls[1][1]
    T, D = q.shape[0], q.shape[2]
    assert a[0].shape == (T, D, 4) and a[0].stride() == (4 * D, 1, D)  # q token-major, a box per head
    for view, heads in ((a[1], 4), (a[2], 8), (a[3], 8)):  # k, v, out feature-major
        assert view.shape == (D, T, heads) and view.stride() == (1, heads * D, D)
    assert a[6] is state and a[7] is state and a[8:11] == (None, None, None)
    assert a[12].dtype == torch.int64 and a[12].tolist() == [0, 4, T]
    assert a[14:22] == (4, 4, 8, 8, 2, 1, 0, 16) and int(a[22]) == 7  # the current stream


def test_a_cache_miss_keeps_to_the_entry_and_says_so_once(monkeypatch, cutlass_stub):
    calls = []
    monkeypatch.setitem(sys.modules, X._SM90, fake_sm90(None, calls))
    monkeypatch.setattr(GUARD, "guard", guard_contract)
    monkeypatch.setattr(X, "_compiled", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            X.gdn_prefill_flashinfer_direct(*args())
    assert [c[0] for c in calls] == ["entry"] * 3
    assert len([w for w in caught if "compile cache" in str(w.message)]) == 1


G = kernel_module("kdispatch.kernels.library.gdn.flashinfer_direct_gathered")
P = kernel_module("kdispatch.kernels.library.gdn.flashinfer_direct_pool")
C = kernel_module("kdispatch.kernels.library.gdn.flashinfer_compiled")
PREPARE = kernel_module("kdispatch.kernels.cuda.gdn.pool_prefill_prepare")


def log_decay_contract(cu, T, *, log_decay, out, malformed):
    """prefill_guard.guard with engines' pre-activated g, on a well-formed batch: alpha = exp(g)."""
    return cu.to(torch.int64), None, torch.exp(log_decay), None


def test_gathered_prefill_calls_the_compiled_kernel_on_its_states(monkeypatch, cutlass_stub):
    """vLLM's convention: alpha = exp(g) from the guard, beta as given, the gathered states in place,
    through the entry once, then the compiled kernel found under the states' configuration."""
    calls, keys = [], []
    compiled = lambda *a: calls.append(("compiled", a))  # noqa: E731
    sm90 = fake_sm90(compiled, calls)
    sm90._get_prefill_kernel = lambda *a, **kw: keys.append(kw) or "kernel"
    monkeypatch.setitem(sys.modules, X._SM90, sm90)
    monkeypatch.setattr(GUARD, "guard", log_decay_contract)
    monkeypatch.setattr(C, "_compiled", {})
    T, n, hq, hv, D = 12, 3, 2, 4, 128
    q, k = torch.randn(T, hq, D, dtype=torch.bfloat16), torch.randn(T, hq, D, dtype=torch.bfloat16)
    v = torch.randn(T, hv, D, dtype=torch.bfloat16)
    g, beta = -torch.rand(T, hv), torch.rand(T, hv)
    states, out = torch.randn(n, hv, D, D), torch.empty(T, hv, D, dtype=torch.bfloat16)
    cu = torch.tensor([0, 5, 5, T], dtype=torch.int32)
    for _ in range(2):
        got_out, got_states = G.gdn_prefill_gathered_flashinfer_direct(q, k, v, g, beta, states, cu, out, 0.125)
        assert got_out is out and got_states is states
    assert [c[0] for c in calls] == ["entry", "compiled"]
    assert len(keys) == 1 and not keys[0]["use_state_indices"] and keys[0]["cu_seqlens_dtype"] == torch.int64
    entry, a = calls[0], calls[1][1]
    assert entry[1][1] is states and entry[1][5] is states and entry[1][9] == 0.125
    assert entry[2] == {"state_indices": None}
    assert torch.equal(a[4], torch.exp(g).reshape(-1)) and torch.equal(a[5], beta.reshape(-1))
    assert a[3].shape == (D, T, hv) and a[3].data_ptr() == out.data_ptr()  # the caller's output, written in place
    assert a[6] is states and a[7] is states and a[8] is None and a[12].tolist() == [0, 5, 5, T]
    assert a[14:22] == (hq, hq, hv, hv, n, 1, 0, n * hv)


def test_gathered_prefill_reads_views_of_a_projection_row_in_place(monkeypatch, cutlass_stub):
    """q/k/v split out of one row (vLLM's mixed_qkv) reach the compiled kernel as they are, with the
    row's token stride; a token stride of no whole number of heads and a head stride other than 128
    are copied first."""
    calls = []
    sm90 = fake_sm90(lambda *a: calls.append(("compiled", a)), calls)
    monkeypatch.setitem(sys.modules, X._SM90, sm90)
    monkeypatch.setattr(GUARD, "guard", log_decay_contract)
    monkeypatch.setattr(C, "_compiled", {})
    T, n, hq, hv, D = 12, 2, 2, 4, 128
    g, beta = -torch.rand(T, hv), torch.rand(T, hv)
    states, out = torch.randn(n, hv, D, D), torch.empty(T, hv, D, dtype=torch.bfloat16)
    cu = torch.tensor([0, 5, T], dtype=torch.int32)
    width = (2 * hq + hv) * D
    for pad, in_place in ((0, True), (4, False)):
        row = torch.randn(T, width + pad, dtype=torch.bfloat16)
        q, k, v = (row[:, a * D:b * D].view(T, b - a, D) for a, b in ((0, hq), (hq, 2 * hq), (2 * hq, 2 * hq + hv)))
        for _ in range(2):  # a process's first call goes through the entry
            G.gdn_prefill_gathered_flashinfer_direct(q, k, v, g, beta, states, cu, out, 0.125)
        kind, a = calls[-1]
        assert kind == "compiled" and a[0].shape == (T, D, hq) and a[2].shape == (D, T, hv)
        for got, given in ((a[0], q), (a[1], k), (a[2], v)):
            assert (got.data_ptr() == given.data_ptr()) is in_place
            heads = given.shape[1]
            seen = given if in_place else got.as_strided(given.shape, (heads * D, D, 1))
            assert torch.equal(seen, given)
        if in_place:
            assert a[0].stride() == (width, 1, D) and a[2].stride() == (1, width, D)
    interleaved = torch.randn(T, D, hv, dtype=torch.bfloat16).transpose(1, 2)  # head stride 1, not 128
    assert not C.takes(interleaved) and C.takes(interleaved.contiguous())


def test_pool_prefill_reads_and_writes_pool_rows_through_the_slots(monkeypatch, cutlass_stub):
    """SGLang's convention: after the prepare launch (stood in for: it returns the operands FlashInfer
    takes), the kernel gets the whole pool as initial and final states and the int32 slots; its
    configuration names the slots' dtype and the pool's inner strides, so a pool with other strides
    is looked up again; no sequences launch nothing."""
    calls, keys = [], []
    compiled = lambda *a: calls.append(("compiled", a))  # noqa: E731
    sm90 = fake_sm90(compiled, calls)
    sm90._get_prefill_kernel = lambda *a, **kw: keys.append(kw) or "kernel"
    monkeypatch.setitem(sys.modules, X._SM90, sm90)
    monkeypatch.setattr(C, "_compiled", {})
    T, hq, hv, D = 9, 2, 4, 128
    q, k = torch.randn(T, hq, D, dtype=torch.bfloat16), torch.randn(T, hq, D, dtype=torch.bfloat16)
    v = torch.randn(T, hv, D, dtype=torch.bfloat16)
    g, beta = -torch.rand(T, hv), torch.rand(T, hv)
    slots, cu = torch.tensor([5, 1], dtype=torch.int32), torch.tensor([0, 4, T], dtype=torch.int32)
    out = torch.empty(T, hv, D, dtype=torch.bfloat16)
    alpha = torch.exp(g)
    prepared = []

    def prepare(q_, k_, v_, g_, beta_, pool_, slots_, has_init_, cu_, out_):
        prepared.append(pool_)
        return q_, k_, v_, alpha, beta_, cu_, slots_

    monkeypatch.setattr(PREPARE, "prepare", prepare)
    pool = torch.randn(8, hv, D, D)
    wide = torch.randn(8, hv, D, D + 4)[..., :D]  # padded rows: other inner strides
    has_init = torch.ones(2, dtype=torch.bool)
    for p in (pool, pool, wide, wide):
        got_out, got_pool = P.gdn_prefill_pool_flashinfer_direct(q, k, v, g, beta, p, slots, has_init, cu, out, None)
        assert got_out is out and got_pool is p
    assert [c[0] for c in calls] == ["entry", "compiled", "entry", "compiled"]
    assert [kw["state_inner_strides"] for kw in keys] == [pool.stride()[1:], wide.stride()[1:]]
    assert all(kw["use_state_indices"] and kw["state_indices_dtype"] == torch.int32
               and kw["init_state_inner_strides"] == kw["state_inner_strides"] for kw in keys)
    entry, a = calls[0], calls[1][1]
    assert entry[1][1] is pool and entry[1][5] is pool and entry[2]["state_indices"] is slots
    assert entry[1][9] == pytest.approx(128 ** -0.5)  # scale None: 1/sqrt(head size)
    assert a[6] is pool and a[7] is pool and a[8] is slots and a[12] is cu
    assert a[14:22] == (hq, hq, hv, hv, 2, 1, 0, 2 * hv)
    P.gdn_prefill_pool_flashinfer_direct(q, k, v, g, beta, pool, slots[:0], has_init[:0], cu[:1], out, None)
    assert len(calls) == 4 and len(prepared) == 5  # prepared (fresh rows, output), nothing launched
