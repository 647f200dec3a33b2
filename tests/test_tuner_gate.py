"""The correctness gate on CPU: the reference passes, perturbed / NaN / wrongly shaped outputs fail,
the in-place state contract is enforced, indexer selections are checked for reachability,
duplicates, count and sorted scores (ties pass), sparse attention handles empty rows, and the FP8
MoE matched-ratio rule follows flashinfer_bench."""
import torch

from kdispatch import checks, definitions, registry
from kdispatch.definitions.dsa_paged.spec import quantize_index_keys
from kdispatch.tuner import gate
from kdispatch.workloads import materialize

DECODE, PREFILL = "gdn_decode", "gdn_prefill"
INDEXER, SPARSE = "dsa_topk_indexer", "dsa_sparse_attention"


def trials(definition, axes, n=2):
    w = {"uuid": f"gate-{definition[:8]}", "axes": axes, "inputs": {}}
    out = []
    for t in range(n):
        args = list(materialize(definition, gate.trial_workload(w, t), device="cpu", seed=0))
        out.append((args, gate.reference(definition, args)))
    return out


def ref_fn(definition):
    return registry.get(definition, "reference").fn


# ---- GDN ------------------------------------------------------------------------------------

def test_reference_passes_gdn():
    for d, axes in ((DECODE, {"batch_size": 3}), (PREFILL, {"total_seq_len": 11, "num_seqs": 3, "len_cu_seqlens": 4})):
        v = gate.run_gate(d, ref_fn(d), trials(d, axes))
        assert v.passed, v.reason
        assert v.metrics["trials"] == 2


def test_trials_use_fresh_inputs():
    t = trials(DECODE, {"batch_size": 2})
    assert not torch.equal(t[0][0][0], t[1][0][0]), "q differs between trials"


def test_perturbed_nan_and_contract_violations_fail():
    t = trials(DECODE, {"batch_size": 2})
    ref = ref_fn(DECODE)

    def perturbed(*args):
        out, state = ref(*args)
        return out + 0.1, state

    def nan(*args):
        out, state = ref(*args)
        out = out.clone()
        out[0, 0, 0, 0] = float("nan")
        return out, state

    def not_in_place(*args):
        out, state = ref(*args)
        return out, state.clone()

    def bad_state(*args):
        out, state = ref(*args)
        state[0, 0, 0, :4] += 1.0
        return out, state

    def wrong_shape(*args):
        out, state = ref(*args)
        return out[:, 0], state

    def wrong_dtype(*args):
        out, state = ref(*args)
        return out.float(), state

    def raises(*args):
        raise RuntimeError("boom")

    expect = {perturbed: "INCORRECT_NUMERICAL", nan: "INCORRECT_NUMERICAL", not_in_place: "INCORRECT_NUMERICAL",
              bad_state: "INCORRECT_NUMERICAL", wrong_shape: "INCORRECT_SHAPE", wrong_dtype: "INCORRECT_DTYPE",
              raises: "RUNTIME_ERROR"}
    for fn, status in expect.items():
        v = gate.run_gate(DECODE, fn, t)
        assert v.status == status, (fn.__name__, v.status, v.reason)
        assert v.reason
    v = gate.run_gate(DECODE, nan, t)
    assert "non-finite" in v.reason
    v = gate.run_gate(DECODE, not_in_place, t)
    assert "in-place" in v.reason


def test_small_errors_within_tolerance_pass():
    t = trials(PREFILL, {"total_seq_len": 9, "num_seqs": 2, "len_cu_seqlens": 3})
    ref = ref_fn(PREFILL)

    def close(*args):
        out, state = ref(*args)
        return (out.float() * (1 + 1e-3)).to(out.dtype), state.mul_(1 + 1e-4)

    v = gate.run_gate(PREFILL, close, t)
    assert v.passed, v.reason
    assert 0 < v.max_abs_err < 1e-2


# ---- DSA indexer ----------------------------------------------------------------------------

INDEXER_AXES = {"batch_size": 3, "max_num_pages": 40, "num_pages": 160}  # up to 2560 tokens: real top-k


def test_reference_passes_indexer():
    v = gate.run_gate(INDEXER, ref_fn(INDEXER), trials(INDEXER, INDEXER_AXES))
    assert v.passed, v.reason


def _edit(fn):
    ref = ref_fn(INDEXER)

    def variant(*args):
        return fn(ref(*args).clone(), *args)

    return variant


def test_indexer_rejects_duplicates_unreachable_and_wrong_counts():
    t = trials(INDEXER, INDEXER_AXES, n=1)
    args = t[0][0]
    seq_lens = args[3]

    def duplicate(idx, *a):
        idx[0, 1] = idx[0, 0]
        return idx

    def unreachable(idx, *a):  # a token of another sequence (pages are distinct across the batch)
        idx[0, 0] = idx[1, 0]
        return idx

    def past_the_end(idx, *a):  # a slot past the sequence's end in its own last page
        b = int(torch.argmin(seq_lens % 64 + (seq_lens % 64 == 0) * 1000))  # a row with a partial last page
        L = int(seq_lens[b])
        page = int(a[4][b, (L - 1) // 64])
        idx[b, 0] = page * 64 + 63
        return idx

    def too_few(idx, *a):
        b = int(torch.argmax(seq_lens))
        n = min(2048, int(seq_lens[b]))
        idx[b, n - 1] = -1
        return idx

    def junk_after(idx, *a):
        b = int(torch.argmin(seq_lens))
        n = min(2048, int(seq_lens[b]))
        if n < 2048:
            idx[b, n] = idx[b, 0]
        else:
            idx[b, 0] = -1
        return idx

    for fn, word in ((duplicate, "duplicate"), (unreachable, "unreachable"), (past_the_end, "unreachable"),
                     (too_few, "fewer"), (junk_after, "-1")):
        v = gate.run_gate(INDEXER, _edit(fn), t)
        assert v.status == "INCORRECT_NUMERICAL", (fn.__name__, v.reason)
        assert word in v.reason, (fn.__name__, v.reason)


def test_indexer_rejects_a_worse_selection():
    t = trials(INDEXER, INDEXER_AXES, n=1)
    args, ref = t[0]
    scores, token_ids = ref.extra["scores"], ref.extra["token_ids"]
    b = int(torch.argmax(args[3]))
    assert int(args[3][b]) > 2048, "needs a row with more tokens than top-k"

    def worse(idx, *a):
        worst = int(torch.argmin(scores[b].masked_fill(torch.isinf(scores[b]), float("inf"))))
        idx[b, 0] = int(token_ids[b, worst])  # swap the best token for the worst one
        return idx

    v = gate.run_gate(INDEXER, _edit(worse), t)
    assert v.status == "INCORRECT_NUMERICAL" and "sorted scores" in v.reason


def test_indexer_ties_pass():
    """All keys equal: every token scores the same, so any 2048 distinct valid tokens are right."""
    g = torch.Generator().manual_seed(0)
    pages, max_pages, L = 40, 34, 34 * 64 - 5
    key = torch.randn(128, generator=g)
    cache = quantize_index_keys(key.expand(pages, 64, 128).contiguous())
    q = torch.randn(1, 64, 128, generator=g).to(torch.float8_e4m3fn)
    weights = torch.rand(1, 64, generator=g)
    seq_lens = torch.tensor([L], dtype=torch.int32)
    block_table = torch.randperm(pages, generator=g)[:max_pages].to(torch.int32)[None]
    args = [q, cache, weights, seq_lens, block_table]
    ref = gate.reference(INDEXER, args)

    def other_choice(*a):  # the LAST 2048 tokens of the sequence, in reverse order
        pos = torch.arange(L - 1, L - 1 - 2048, -1)
        return (block_table[0, pos // 64].long() * 64 + pos % 64).to(torch.int32)[None]

    chosen, refsel = set(other_choice(*args)[0].tolist()), set(ref.outputs[0][0].tolist())
    assert chosen != refsel, "a genuinely different selection"
    v = gate.run_gate(INDEXER, other_choice, [(args, ref)])
    assert v.passed, v.reason


# ---- DSA sparse attention -------------------------------------------------------------------

def test_sparse_attention_reference_perturbation_and_empty_rows():
    axes = {"num_tokens": 3, "num_pages": 48}
    t = trials(SPARSE, axes, n=1)
    args, _ = t[0]
    args[4][1] = -1  # token 1 attends to nothing
    ref = gate.reference(SPARSE, args)
    assert torch.isneginf(ref.outputs[1][1]).all() and (ref.outputs[0][1] == 0).all()
    rf = ref_fn(SPARSE)
    t = [(args, ref)]
    assert gate.run_gate(SPARSE, rf, t).passed

    def natural_log(*a):
        out, lse = rf(*a)
        return out, lse * 0.6931471805599453

    def nan_in_empty_row(*a):
        out, lse = rf(*a)
        out = out.clone()
        out[1] = float("nan")
        return out, lse

    def finite_lse_in_empty_row(*a):
        out, lse = rf(*a)
        lse = lse.clone()
        lse[1] = 0.0
        return out, lse

    def perturbed(*a):
        out, lse = rf(*a)
        return out + 0.05, lse

    for fn in (natural_log, nan_in_empty_row, finite_lse_in_empty_row, perturbed):
        v = gate.run_gate(SPARSE, fn, t)
        assert v.status == "INCORRECT_NUMERICAL", (fn.__name__, v.reason)


# ---- FP8 MoE (the comparison rule only: the MoE weights take ~20 s to build on a CPU) -------

def test_moe_matched_ratio_follows_flashinfer_bench():
    tol = definitions.get("moe_fp8").spec.tolerance("output")
    assert (tol.atol, tol.rtol, tol.matched_ratio) == (1.0, 0.3, 0.95)
    ref = torch.full((100, 64), 10.0)
    x = ref.clone()
    x.view(-1)[:6 * 64 // 1] = 20.0  # 6% of elements off by 10 (> atol 1 and > 30%)
    assert not checks.compare("output", x.bfloat16(), ref.bfloat16(), tol).passed
    x = ref.clone()
    x.view(-1)[: 4 * 64] = 20.0  # 4%: matched ratio 0.96 passes
    assert checks.compare("output", x.bfloat16(), ref.bfloat16(), tol).passed
    x = ref.clone()
    x.view(-1)[:] = 12.5  # every element 25% off: within rtol 0.3
    assert checks.compare("output", x.bfloat16(), ref.bfloat16(), tol).passed
    x = ref.clone()
    x[0, 0] = float("nan")
    v = checks.compare("output", x.bfloat16(), ref.bfloat16(), tol)
    assert not v.passed and "non-finite" in v.reason


def test_compare_semantics_atol_or_rtol():
    tol = checks.Tol(1e-2, 1e-2)
    ref = torch.tensor([100.0, 0.001, 1.0])
    assert checks.compare("o", torch.tensor([100.5, 0.005, 1.0]), ref, tol).passed  # rel 0.5% / abs 0.004
    assert not checks.compare("o", torch.tensor([102.0, 0.001, 1.0]), ref, tol).passed  # abs 2 and rel 2%
