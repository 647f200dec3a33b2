"""The engines' GDN prefill convention (gdn_prefill_pool_*): its reference is the contest prefill's
math on the same inputs, padding sequences and unnamed slots stay untouched, a sequence without an
initial state starts from zeros, malformed boundaries are a whole-batch no-op, and the op picks the
definition by head count and takes a pool whose slot pitch exceeds a slot."""
import pytest
import torch
import torch.nn.functional as F

import kdispatch
from kdispatch.references import gdn_prefill as contest
from kdispatch.references import gdn_prefill_pool as pool_ref
from kdispatch.workloads import materialize


def pool_args(hq, hv, total, seqs, slots, seed=0):
    w = {"axes": {"total_seq_len": total, "num_seqs": seqs, "num_slots": slots}, "inputs": {},
         "uuid": f"pool-prefill-{hv}-{total}-{seqs}"}
    return list(materialize(f"gdn_prefill_pool_qk{hq}_v{hv}", w, device="cpu", seed=seed))


def clone(args):
    return [x.clone() if torch.is_tensor(x) else x for x in args]


def test_reference_is_the_contest_prefill_on_the_same_inputs():
    """Contest inputs (unit q/k, raw gates) through both references: the pool one given the gates the
    engine would compute and the initial states in their slots."""
    w = {"axes": {"total_seq_len": 23, "num_seqs": 3}, "inputs": {}, "uuid": "pool-vs-contest"}
    q, k, v, state, A_log, a, dt_bias, b, cu, scale = materialize("gdn_prefill", w)
    want_out, want_state = contest.run(q, k, v, state, A_log, a, dt_bias, b, cu, scale)
    g = -torch.exp(A_log) * F.softplus(a.float() + dt_bias)
    beta = torch.sigmoid(b.float())
    pool = torch.randn(6, 8, 128, 128)
    slots = torch.tensor([4, 1, 5], dtype=torch.int32)
    pool[slots.long()] = state
    got_out, got_pool = pool_ref.run(q, k, v, g, beta, pool, slots, torch.ones(3, dtype=torch.bool),
                                     cu.to(torch.int32), torch.empty_like(want_out), scale)
    # q, k renormalised after rounding to bf16: ~1e-3 relative apart
    torch.testing.assert_close(got_out, want_out, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got_pool[slots.long()], want_state, rtol=1e-3, atol=1e-3)
    for s in (0, 2, 3):
        assert torch.equal(got_pool[s], pool[s])


def test_padding_sequences_fresh_starts_and_malformed_boundaries():
    args = pool_args(2, 4, 30, 9, 12)
    q, k, v, g, beta, pool, idx, has_init, cu, out, scale = args
    assert int((idx < 0).sum()) == 1
    has_init[0] = False
    got_out, got_pool = pool_ref.run(*args)
    pad = int((idx < 0).nonzero()[0])
    rows = slice(int(cu[pad]), int(cu[pad + 1]))
    assert not got_out[rows].any(), "a padding sequence's output is zero"
    named = set(idx[idx >= 0].tolist())
    for s in range(12):
        assert torch.equal(got_pool[s], pool[s]) == (s not in named), s
    # a fresh sequence does not depend on what its slot held
    other = clone(args)
    other[5][int(idx[0])] = 123.0
    out2, pool2 = pool_ref.run(*other)
    assert torch.equal(out2, got_out) and torch.equal(pool2[int(idx[0])], got_pool[int(idx[0])])
    bad = clone(args)
    bad[8][-1] = 29
    bad_out, bad_pool = pool_ref.run(*bad)
    assert not bad_out.any() and torch.equal(bad_pool, pool)


def test_the_op_picks_the_head_count_and_takes_a_strided_pool():
    args = pool_args(8, 16, 17, 3, 5)
    want_out, want_pool = kdispatch.ops.gdn_prefill_pool(*clone(args))
    pool = args[5]
    slot = pool[0].numel()
    pages = torch.zeros(5, slot + 256)
    pages[:, :slot] = pool.reshape(5, -1)
    view = pages.as_strided(pool.shape, (slot + 256, *pool.stride()[1:]))
    args[5] = view
    out, new_pool = kdispatch.ops.gdn_prefill_pool(*args[:9])
    assert new_pool is view and out.shape == (17, 16, 128)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(view, want_pool, rtol=0, atol=0)
    with pytest.raises(ValueError, match="HV one of"):
        kdispatch.ops.gdn_prefill_pool(args[0], args[1], args[2][:, :12], *args[3:9])


def test_segments_walked_apart_then_chained_give_the_whole_walk():
    """The identity the context-parallel prefill (cuda_prefill_cp, kernels/cuda/gdn/prefill_cp.cu) rests
    on, checked on the reference: a sequence cut in two, its second part walked from a zero state (final
    state B, outputs o) and, with no values, from the identity (final state A, outputs o~), gives the whole
    walk's final state S1 A + B and outputs o + o~ S1^T, S1 the state after the first part."""
    hq, hv, total, cut = 2, 4, 40, 16
    q, k, v, g, beta, pool, slots, init, cu, out, scale = pool_args(hq, hv, total, 1, 2, seed=3)
    slots, init[0] = torch.zeros(1, dtype=torch.int32), True
    whole_out, whole_pool = pool_ref.run(q, k, v, g, beta, pool, slots, init, cu, out, scale)

    def part(lo, hi, values, start):
        cu_part = torch.tensor([0, hi - lo], dtype=torch.int32)
        o, s = pool_ref.run(q[lo:hi], k[lo:hi], values[lo:hi], g[lo:hi], beta[lo:hi], start, slots, init, cu_part,
                            out[lo:hi], scale)
        return o.float(), s[0]

    _, s1 = part(0, cut, v, pool)
    o_zero, b = part(cut, total, v, torch.zeros_like(pool))
    identity = torch.eye(128).expand(pool.shape[0], hv, 128, 128).contiguous()
    o_keys, a = part(cut, total, torch.zeros_like(v), identity)
    got_out, want_out = o_zero + torch.einsum("thk,hvk->thv", o_keys, s1), whole_out[cut:].float()
    torch.testing.assert_close(got_out, want_out, rtol=1e-2, atol=1e-3)  # bf16 outputs, each rounded once
    torch.testing.assert_close(s1 @ a + b, whole_pool[0], rtol=1e-4, atol=1e-4)
    # the correction carries the first part: without it the outputs are far off
    assert (o_zero - want_out).abs().max() > 10 * (got_out - want_out).abs().max()


def test_context_parallel_is_offered_from_cp_min_tokens():
    """cuda_prefill_cp's `supports` (the tuner measures it only there): every batch of CP_MIN_TOKENS tokens or
    more, however many sequences; not registered where one sequence has more than CP_MAX_HEADS heads."""
    from kdispatch import registry
    from kdispatch.kernels.cuda.gdn import prefill_cp as pc

    registry.discover()
    for hq, hv in ((2, 4), (4, 8), (8, 16), (16, 32)):
        name = f"gdn_prefill_pool_qk{hq}_v{hv}"
        if hv > pc.CP_MAX_HEADS:
            with pytest.raises(KeyError):
                registry.get(name, "cuda_prefill_cp.p4")
            continue
        v = registry.get(name, "cuda_prefill_cp.p4")
        for seqs in (1, 64, 256):
            assert v.declines({"num_seqs": seqs, "total_seq_len": pc.CP_MIN_TOKENS}) is None
        assert "tokens" in v.declines({"num_seqs": 1, "total_seq_len": pc.CP_MIN_TOKENS - 1})


def cp_split(lengths, HV: int, P: int, sms: int) -> list[int]:
    """The segments each sequence gets from the .cu's cp_plan (restated): its 16-token blocks over seg, at
    least one, at most P; seg the larger of CP_SEG_BLOCKS and the batch's blocks' steps over the SMs' rate."""
    import numpy as np

    from kdispatch.kernels.cuda.gdn import prefill_cp as pc

    edges = np.cumsum([0] + list(lengths))
    blocks = [(-(-int(e) // 16) - int(b) // 16) if e > b else 0 for b, e in zip(edges[:-1], edges[1:])]
    nvb = 128 // (16 * pc.CP_WALK[0])
    busy = np.float32(sum(blocks)) * np.float32(HV) * np.float32(nvb) / (np.float32(pc.CP_RATE) * np.float32(sms))
    seg = int(np.ceil(busy)) if busy > pc.CP_SEG_BLOCKS else pc.CP_SEG_BLOCKS
    return [min(P, max(1, nb // seg)) for nb in blocks], blocks


def test_cp_plan_fits_the_grids_sized_for_it():
    """cp_bounds sizes the CP grids (extra segments, correction chunks) for the most any valid batch of T
    tokens in N sequences can get from the .cu's cp_plan; a plan past them would walk the batch unsplit
    (safe, slow). Random batches, long-among-short and equal ones, every configuration, several SM counts."""
    import random

    from kdispatch.kernels.cuda.gdn import prefill_cp as pc

    rng = random.Random(5)
    for _ in range(3000):
        N = rng.choice((1, 2, 3, 4, 8, 16, 64))
        T = rng.choice((1, 100, 1024, 4096, 8192, 32768)) * rng.choice((1, 1, 2)) // rng.choice((1, 3))
        T = max(T, 1)
        mix = rng.choice(("random", "skewed", "equal"))
        if mix == "equal":
            lengths = [T // N + (i < T % N) for i in range(N)]
        elif mix == "skewed":
            short = max(0, T // 8 // max(N - 1, 1))
            lengths = [short] * (N - 1) + [T - short * (N - 1)] if T >= short * (N - 1) else [T] + [0] * (N - 1)
            rng.shuffle(lengths)
        else:
            cuts = sorted(rng.randint(0, T) for _ in range(N - 1))
            lengths = [b - a for a, b in zip([0] + cuts, cuts + [T])]
        P, HV, sms = rng.choice(pc.CP_SEGMENTS), rng.choice((1, 4, 8, 16)), rng.choice((16, 78, 132))
        e_max, c_max = pc.cp_bounds(T, N, P, HV, sms)
        segs, blocks = cp_split(lengths, HV, P, sms)
        chunks = sum(-(-((p + 1) * nb // s - p * nb // s) // pc.CORRECT_BLOCKS)
                     for nb, s in zip(blocks, segs) for p in range(1, s))
        assert sum(s - 1 for s in segs) <= e_max and chunks <= c_max, (T, N, P, HV, sms, mix, lengths)


def test_cp_plan_splits_what_the_gpu_would_otherwise_wait_for():
    """cp_plan's rule (restated above): equal sequences that keep the H200's 132 SMs busy are walked whole; one
    long sequence among short ones is cut, the short ones not; a lone long sequence into the configuration's
    segments, no more than the rate allows."""
    assert cp_split([512] * 16, HV=4, P=4, sms=132)[0] == [1] * 16  # 16 x 8,192 equal: 64 pairs
    segs = cp_split([64] * 15 + [7232], HV=4, P=16, sms=132)[0]
    assert segs[:15] == [1] * 15 and 4 <= segs[15] <= 16
    assert cp_split([4096], HV=4, P=4, sms=132)[0] == [4]
    assert cp_split([1024] * 4, HV=4, P=4, sms=132)[0] == [4] * 4  # 16 pairs of 64 blocks
    assert cp_split([1024] * 4, HV=8, P=4, sms=132)[0] == [2] * 4  # 32 pairs: half as many
    assert cp_split([256] * 8, HV=4, P=16, sms=132)[0] == [1] * 8  # under two CP_SEG_BLOCKS each


def test_cuda_first_launch_refuses_head_ratios_it_cannot_hold():
    """The CUDA first launch keeps at most ALGEBRA_HEADS value heads a q/k head in registers: more (or a
    ratio that does not divide) is refused before any launch rather than leaving heads uncomputed."""
    from kdispatch.kernels.cuda.gdn import prefill_walk as pw

    T, cu = 16, torch.tensor([0, 16], dtype=torch.int32)
    for hq, hv in ((1, pw.ALGEBRA_HEADS + 1), (2, 3)):
        q = torch.zeros(T, hq, 128, dtype=torch.bfloat16)
        gates = torch.zeros(T, hv)
        with pytest.raises(ValueError, match="value heads over"):
            pw.algebra(q, q, (gates, gates, None, None), cu, hv, 0.088, contest=False)
