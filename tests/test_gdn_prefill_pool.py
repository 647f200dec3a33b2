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
    """The identity the context-parallel prefill (cuda_prefill_cp, kernels/cuda/gdn/prefill_walk.cu) rests
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


def test_context_parallel_is_offered_only_to_few_long_sequences():
    """cuda_prefill_cp's `supports` (the tuner measures it only there): up to CP_MAX_PAIRS (sequence,
    value head) pairs from CP_MIN_TOKENS tokens; not registered where one sequence has more than
    CP_MAX_HEADS heads."""
    from kdispatch import registry
    from kdispatch.kernels.cuda.gdn import prefill_walk as pw

    registry.discover()
    for hq, hv in ((2, 4), (4, 8), (8, 16), (16, 32)):
        name = f"gdn_prefill_pool_qk{hq}_v{hv}"
        if hv > pw.CP_MAX_HEADS:
            with pytest.raises(KeyError):
                registry.get(name, "cuda_prefill_cp.p8")
            continue
        v = registry.get(name, "cuda_prefill_cp.p8")
        most = pw.CP_MAX_PAIRS // hv
        assert v.declines({"num_seqs": most, "total_seq_len": pw.CP_MIN_TOKENS}) is None
        assert "pairs" in v.declines({"num_seqs": most + 1, "total_seq_len": 10 * pw.CP_MIN_TOKENS})
        assert "tokens" in v.declines({"num_seqs": 1, "total_seq_len": pw.CP_MIN_TOKENS - 1})


def test_correction_grid_covers_every_segment():
    """correct_chunks sizes the CP correction's grid for the longest segment past the first that a batch of
    T tokens can hold, each sequence in as many segments as its 16-token blocks allow (the .cu's
    segments_of and segment_of, restated here): a segment longer than the grid would keep part of its
    outputs uncorrected."""
    from kdispatch.kernels.cuda.gdn import prefill_walk as pw

    for P in pw.CP_SEGMENTS:
        for T in (1, 100, 300, 1000, 4096):
            room = pw.correct_chunks(T, P) * pw.CORRECT_BLOCKS
            for offset in (0, 7, 15):  # where the sequence starts in its first block
                for length in range(1, T - offset + 1):
                    blocks = -(-(offset + length) // 16)
                    segments = min(P, max(1, blocks // pw.CP_SEG_BLOCKS))
                    edges = [p * blocks // segments for p in range(segments + 1)]
                    longest = max((b - a for a, b in zip(edges[1:-1], edges[2:])), default=0)
                    assert longest <= room, (P, T, offset, length)


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
