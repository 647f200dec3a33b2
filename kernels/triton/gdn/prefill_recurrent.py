"""GDN prefill, fused recurrent: one Triton kernel, the state kept in registers across tokens.

Definition: gdn_prefill_qk4_v8_d128_k_last.

    q, k        [T, HQK, K]    bf16   (T = total tokens of all sequences, packed; HQK = 4)
    v           [T, HV, V]     bf16   (HV = 8; v-head h reads q/k head h // (HV // HQK))
    state       [N, HV, V, K]  fp32   k-last initial state per sequence; final state written IN PLACE
    A_log [HV] fp32,  a [T, HV] bf16,  dt_bias [HV] fp32,  b [T, HV] bf16
    cu_seqlens  [N + 1]        int64  sequence n holds tokens cu_seqlens[n] : cu_seqlens[n + 1]
    scale       python float (None or 0 -> K ** -0.5)
    -> output [T, HV, V] bf16, new_state (= `state`)

The gated delta rule is applied token by token within each sequence (see decode_splitv.py for the
per-row update). A sequence with no tokens keeps its state unchanged, as in kdispatch's reference
(the official FlashInfer-Bench reference returns zeros for it; contest workloads have none).

Kernel: one program per (sequence, v-head, block of BV rows of V); grid = N * HV * (V // BV). The
program checks all of cu_seqlens on the device first (no host sync, CUDA-graph safe; a malformed
batch zeroes the output and leaves the states as they are, the reference's rule), reads its
sequence's bounds, loads its [BV, K] state block once, runs the recurrence over the sequence's
tokens with the block in registers (the next token's q/k/v/gates are loaded before the current token
is computed, so global latency overlaps the arithmetic), writes BV outputs per token, and stores the
final block once. The per-token critical path is one K-reduction of S plus a few FMAs: S.k and S.q
are both taken from the previous state (g and the delta term are applied after), and all tensors
share one 2-D layout. Time ~ (longest sequence) x (per-token latency of one program): good for short
sequences; long ones belong to a chunked kernel. `prefill_config(N)` is the launch heuristic.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.kernels.triton.gdn.decode_splitv import _lastdim_contig, _resolve_scale
from kdispatch.registry import variant


@triton.jit
def _gdn_prefill_recurrent_kernel(
    q_ptr, k_ptr, v_ptr, state_ptr, A_log_ptr, a_ptr, dt_bias_ptr, b_ptr, cu_ptr, out_ptr,
    scale, T, N,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh,  # token and head strides (elements); last axis contiguous
    s_at, s_ah, s_bt, s_bh,
    s_sn, s_sh, s_sv,  # state strides of sequence, head, V row; K is contiguous
    HV: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    BLOCK_CU: tl.constexpr,  # a power of two > N: every program checks all of cu_seqlens
):
    NVB: tl.constexpr = V // BV
    pid = tl.program_id(0)
    i_vb = pid % NVB
    i_nh = pid // NVB
    i_h = i_nh % HV
    i_n = (i_nh // HV).to(tl.int64)
    i_hk = i_h // (HV // HQK)

    # A malformed batch (not 0 = cu[0] <= ... <= cu[N] = T) runs no sequence and leaves every state
    # as it is; its programs zero the output rows [n T / N, (n + 1) T / N) of their head and V block.
    offs_cu = tl.arange(0, BLOCK_CU)
    cu = tl.load(cu_ptr + offs_cu, mask=offs_cu <= N, other=0)
    cu_prev = tl.load(cu_ptr + offs_cu - 1, mask=(offs_cu >= 1) & (offs_cu <= N), other=0)
    bad = ((offs_cu == 0) & (cu != 0)) | ((offs_cu <= N) & (cu < cu_prev)) | ((offs_cu == N) & (cu != T))
    ok = tl.sum(bad.to(tl.int32), axis=0) == 0
    bos = tl.where(ok, tl.load(cu_ptr + i_n), 0).to(tl.int64)
    eos = tl.where(ok, tl.load(cu_ptr + i_n + 1), 0).to(tl.int64)
    zero_lo = tl.where(ok, 0, i_n * T // N)
    zero_hi = tl.where(ok, 0, (i_n + 1) * T // N)

    # Every tensor lives in the one 2-D [BV, K] layout ([1, K] rows, [BV, 1] columns), so the
    # per-token loop needs no layout conversion (no shared-memory round trip, no barrier).
    offs_k = tl.arange(0, K)[None, :]  # [1, K]
    offs_v = i_vb * BV + tl.arange(0, BV)[:, None]  # [BV, 1]
    s_ptrs = state_ptr + i_n * s_sn + i_h * s_sh + offs_v * s_sv + offs_k
    S = tl.load(s_ptrs)  # [BV, K] fp32, kept in registers for the whole sequence

    A = tl.exp(tl.load(A_log_ptr + i_h))
    dtb = tl.load(dt_bias_ptr + i_h)

    # Token-invariant pointer bases; t advances them.
    q_base = q_ptr + i_hk * s_qh + offs_k
    k_base = k_ptr + i_hk * s_kh + offs_k
    v_base = v_ptr + i_h * s_vh + offs_v
    a_base = a_ptr + i_h * s_ah
    b_base = b_ptr + i_h * s_bh
    o_base = out_ptr + i_h * V + offs_v

    # Prefetch token bos (clamped to a valid row when the sequence is empty).
    t0 = tl.minimum(bos, tl.maximum(eos - 1, 0))
    q_n = tl.load(q_base + t0 * s_qt)
    k_n = tl.load(k_base + t0 * s_kt)
    v_n = tl.load(v_base + t0 * s_vt)
    a_n = tl.load(a_base + t0 * s_at)
    b_n = tl.load(b_base + t0 * s_bt)

    for t in range(bos, eos):
        q = q_n.to(tl.float32)
        k = k_n.to(tl.float32)
        v = v_n.to(tl.float32)
        a = a_n.to(tl.float32)
        b = b_n.to(tl.float32)
        # Next token's inputs, in flight while this token is computed (the last token re-loads
        # itself: always in bounds).
        tn = tl.minimum(t + 1, eos - 1)
        q_n = tl.load(q_base + tn * s_qt)
        k_n = tl.load(k_base + tn * s_kt)
        v_n = tl.load(v_base + tn * s_vt)
        a_n = tl.load(a_base + tn * s_at)
        b_n = tl.load(b_base + tn * s_bt)

        # Short critical path: both state reductions read the previous S (not g * S), so they
        # run in parallel with each other and with the gate arithmetic:
        #   old = (g S) k = g (S k),  o = scale (S' q) = scale (g (S q) + delta (k q)).
        sk = tl.sum(S * k, axis=1, keep_dims=True)  # [BV, 1]
        sq = tl.sum(S * q, axis=1, keep_dims=True)  # [BV, 1]
        kq = tl.sum(k * q, axis=1, keep_dims=True)  # [1, 1], independent of S
        x = a + dtb
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        g = tl.exp(-A * softplus)
        beta = 1.0 / (1.0 + tl.exp(-b))

        delta = beta * (v - g * sk)  # [BV, 1]: new_v - old
        S = g * S + delta * k
        o = scale * (g * sq + delta * kq)
        tl.store(o_base + t * (HV * V), o.to(out_ptr.dtype.element_ty))

    tl.store(s_ptrs, S)  # an empty sequence stores its initial state back unchanged
    for t in range(zero_lo, zero_hi):
        tl.store(o_base + t * (HV * V), tl.zeros([BV, 1], dtype=out_ptr.dtype.element_ty))


# Launch heuristic, from a sweep on an H100 (CUDA-graph replay, equal-length sequences;
# BV/num_warps: us per call). One warp per program is always best (the K-reductions stay inside a
# warp); the per-token latency grows with BV, so BV is as small as keeps <= ~2048 programs:
#
#   T     N    2/1    4/1    8/1   16/1
#   6     1   14.9   11.0   18.1   17.8
#   134   1   43.1   65.3   75.1  153.8
#   134   2   33.0   60.2   47.4   85.1
#   2048  3  327.6  355.6  359.0  757.9
#   8192  4 1397.8 1424.1 1480.3 3168.0
#   4124 15  604.7  479.3  403.7  447.5
#   8192 32 1171.6  859.7  713.5  899.6
#   8192 57 1156.6  846.3  707.2  849.0
#
# Long sequences are far slower than a chunked (tensor-core) kernel: the recurrent form does
# ~4 fp32 FMAs per state element per token plus two warp-shuffle reductions per row.
def prefill_config(num_seqs: int, num_v_heads: int = 8, head_v: int = 128) -> tuple[int, int]:
    """(BV, num_warps) for a prefill batch of `num_seqs` sequences; see the table above."""
    bv = 2
    while bv < 8 and num_seqs * num_v_heads * (head_v // bv) > 2048:
        bv *= 2
    return min(bv, head_v), 1


def gdn_prefill_recurrent(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, *,
                          BV: int | None = None, num_warps: int | None = None):
    """Prefill; returns (output [T, HV, V] bf16, state) with `state` holding the final states."""
    T, HQK, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = cu_seqlens.shape[0] - 1
    assert HV % HQK == 0 and k.shape[1] == HQK
    if state is None:
        state = torch.zeros(N, HV, V, K, dtype=torch.float32, device=q.device)
    assert state.dtype == torch.float32 and state.stride(-1) == 1, "state must be fp32, K contiguous"
    dbv, dnw = prefill_config(N, HV, V)
    BV = BV or dbv
    num_warps = num_warps or dnw
    assert V % BV == 0

    q, k, v = _lastdim_contig(q), _lastdim_contig(k), _lastdim_contig(v)
    A_log, dt_bias, cu_seqlens = A_log.contiguous(), dt_bias.contiguous(), cu_seqlens.contiguous()
    out = torch.empty(T, HV, V, dtype=torch.bfloat16, device=q.device)
    if N <= 0:
        return out, state
    if T == 0:  # every sequence empty: every state stays as it is
        return out, state
    grid = (N * HV * (V // BV),)
    _gdn_prefill_recurrent_kernel[grid](
        q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, out,
        _resolve_scale(scale, K), T, N,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        state.stride(0), state.stride(1), state.stride(2),
        HV=HV, HQK=HQK, K=K, V=V, BV=BV, BLOCK_CU=triton.next_power_of_2(N + 1), num_warps=num_warps,
    )
    return out, state


@variant("gdn_prefill", "triton_prefill_recurrent", backend="triton", archs=("sm90",),  # measured on Hopper only; Blackwell is planned, not claimed
         requires=("triton",))
def gdn_prefill_triton_recurrent(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    return gdn_prefill_recurrent(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)
