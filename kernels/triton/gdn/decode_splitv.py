"""GDN decode (one token per sequence), split over the V rows of the state: Triton.

Definition: gdn_decode_qk4_v8_d128_k_last.

    q, k     [B, 1, HQK, K]   bf16   (HQK = 4 q/k heads)
    v        [B, 1, HV, V]    bf16   (HV = 8 v heads; v-head h reads q/k head h // (HV // HQK))
    state    [B, HV, V, K]    fp32   k-last: state[b, h, r, :] is V row r; updated IN PLACE
    A_log    [HV] fp32,  a [B, 1, HV] bf16,  dt_bias [HV] fp32,  b [B, 1, HV] bf16
    scale    python float (None or 0 -> K ** -0.5)
    -> output [B, 1, HV, V] bf16, new_state (= `state`, written in place)

Per (b, h), with g = exp(-exp(A_log) * softplus(a + dt_bias)) and beta = sigmoid(b), every V row r
of the state is independent:

    S      = g * state[r, :]
    old    = S . k
    delta  = beta * (v[r] - old)          # = new_v - old, new_v = beta * v[r] + (1 - beta) * old
    S'     = S + delta * k                 # written back to state[r, :]
    out[r] = scale * S' . q = scale * (S . q + delta * (k . q))

Kernel: one program per (b, h, block of BV rows); grid = B * HV * (V // BV), the BV-blocks of one
(b, h) adjacent so their shared q/k/v/gate loads hit L2. Each program streams its [BV, K] fp32 state
block exactly once (one wide, K-contiguous load; one store) and loads q, k, v and the four gate
scalars once; the gates are computed in the kernel. The job is memory-bound (2 * 512 B of state
traffic per row against ~6 flops per element), so BV only trades parallelism (small B: more, smaller
programs to fill the SMs) against per-program overhead and redundant q/k loads (large B).
`decode_config(B)` is the heuristic; `gdn_decode_splitv(..., BV=, num_warps=)` overrides it.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kdispatch.registry import variant


@triton.jit
def _gdn_decode_splitv_kernel(
    q_ptr, k_ptr, v_ptr, state_ptr, A_log_ptr, a_ptr, dt_bias_ptr, b_ptr, out_ptr,
    scale,
    s_qb, s_qh,  # q/k strides (elements) of the batch and head axes; the last axis is contiguous
    s_kb, s_kh,
    s_vb, s_vh,
    s_ab, s_ah,  # a/b strides of the batch and head axes
    s_bb, s_bh,
    s_sb, s_sh, s_sv,  # state strides of batch, head, V row; K is contiguous
    HV: tl.constexpr, HQK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
):
    NVB: tl.constexpr = V // BV
    pid = tl.program_id(0)
    i_vb = pid % NVB
    i_bh = pid // NVB
    i_h = i_bh % HV
    i_b = (i_bh // HV).to(tl.int64)
    i_hk = i_h // (HV // HQK)

    # Every tensor lives in the one 2-D [BV, K] layout ([1, K] rows, [BV, 1] columns): no layout
    # conversion (shared-memory round trip) between the loads and the arithmetic.
    offs_k = tl.arange(0, K)[None, :]  # [1, K]
    offs_v = i_vb * BV + tl.arange(0, BV)[:, None]  # [BV, 1]

    # The state block first: it is the only large load, issue it before the small ones. It is read
    # and written exactly once, so keep it from displacing anything in L2 (evict_first on the load,
    # streaming store).
    s_ptrs = state_ptr + i_b * s_sb + i_h * s_sh + offs_v * s_sv + offs_k
    S = tl.load(s_ptrs, eviction_policy="evict_first")

    q = tl.load(q_ptr + i_b * s_qb + i_hk * s_qh + offs_k).to(tl.float32)  # [1, K]
    k = tl.load(k_ptr + i_b * s_kb + i_hk * s_kh + offs_k).to(tl.float32)  # [1, K]
    v = tl.load(v_ptr + i_b * s_vb + i_h * s_vh + offs_v).to(tl.float32)  # [BV, 1]

    # Gates: g = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b).
    x = tl.load(a_ptr + i_b * s_ab + i_h * s_ah).to(tl.float32) + tl.load(dt_bias_ptr + i_h)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))  # torch's threshold
    g = tl.exp(-tl.exp(tl.load(A_log_ptr + i_h)) * softplus)
    beta = 1.0 / (1.0 + tl.exp(-tl.load(b_ptr + i_b * s_bb + i_h * s_bh).to(tl.float32)))

    S = S * g
    old = tl.sum(S * k, axis=1, keep_dims=True)  # [BV, 1]
    delta = beta * (v - old)
    S = S + delta * k
    o = scale * tl.sum(S * q, axis=1, keep_dims=True)  # [BV, 1]

    tl.store(s_ptrs, S, cache_modifier=".cs")
    tl.store(out_ptr + (i_b * HV + i_h) * V + offs_v, o.to(out_ptr.dtype.element_ty))


# ---------------------------------------------------------------------------------------------
# Launch heuristic, from sweeps on an H100 80GB HBM3 (triton 3.6, CUDA-graph replay, state rotated
# through > 200 MB so it comes from HBM; us per call; BV/num_warps):
#
#   B      8/8   32/1   16/4   8/2  | fla (anchors) | HBM floor (2 x state / 3.35 TB/s)
#   1     2.32   4.97   3.27   2.76 |   2.49        |  0.31
#   4     3.42   6.04   4.70   4.13 |   3.53        |  1.26
#   8     4.63   7.63   6.78   5.67 |   4.71        |  2.52
#   16    7.66  12.04  10.67   8.74 |   7.11        |  5.04
#   32   13.54  24.26  17.82  15.25 |  12.22        | 10.07
#   48   19.44  33.08  24.52  21.19 |  18.89        | 15.11
#   64   25.21  41.82  31.24  27.35 |  25.18        | 20.15
#   128  48.10  79.05  57.26  50.30 |  48.38        | 40.30
#
# BV = 8 with 8 warps (one 16-byte vector of state per thread; 128 programs at B = 1) is best or
# within 2% of best at every batch size, so the heuristic is a constant; the function stays the one
# place to change it. Large B reaches ~84% of the 3.35 TB/s datasheet floor, ~95% of the ~3.0 TB/s a
# device-to-device copy reaches on this card.
# ---------------------------------------------------------------------------------------------
def decode_config(batch_size: int, num_v_heads: int = 8, head_v: int = 128) -> tuple[int, int]:
    """(BV, num_warps) for a decode batch; see the table above."""
    return min(8, head_v), 8


def _resolve_scale(scale, head_k: int) -> float:
    if isinstance(scale, torch.Tensor):  # kdispatch.ops passes a float; a tensor costs a sync
        scale = float(scale)
    if scale is None or scale == 0.0:
        return 1.0 / math.sqrt(head_k)
    return float(scale)


def _lastdim_contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def gdn_decode_splitv(q, k, v, state, A_log, a, dt_bias, b, scale, *, BV: int | None = None,
                      num_warps: int | None = None):
    """Decode step; returns (output [B, 1, HV, V] bf16, state) with `state` updated in place."""
    B, T, HQK, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    assert T == 1, "decode takes one token per sequence"
    assert HV % HQK == 0 and k.shape[2] == HQK
    if state is None:
        state = torch.zeros(B, HV, V, K, dtype=torch.float32, device=q.device)
    assert state.dtype == torch.float32 and state.stride(-1) == 1, "state must be fp32, K contiguous"
    dbv, dnw = decode_config(B, HV, V)
    BV = BV or dbv
    num_warps = num_warps or dnw
    assert V % BV == 0

    q, k, v = _lastdim_contig(q), _lastdim_contig(k), _lastdim_contig(v)
    A_log, dt_bias = A_log.contiguous(), dt_bias.contiguous()
    out = torch.empty(B, 1, HV, V, dtype=torch.bfloat16, device=q.device)
    if B == 0:
        return out, state
    grid = (B * HV * (V // BV),)
    _gdn_decode_splitv_kernel[grid](
        q, k, v, state, A_log, a, dt_bias, b, out,
        _resolve_scale(scale, K),
        q.stride(0), q.stride(2), k.stride(0), k.stride(2), v.stride(0), v.stride(2),
        a.stride(0), a.stride(2), b.stride(0), b.stride(2),
        state.stride(0), state.stride(1), state.stride(2),
        HV=HV, HQK=HQK, K=K, V=V, BV=BV, num_warps=num_warps,
    )
    return out, state


@variant("gdn_decode", "triton_decode_splitv", backend="triton", archs=("sm90",),  # measured on Hopper only; Blackwell is planned, not claimed
         requires=("triton",))
def gdn_decode_triton_splitv(q, k, v, state, A_log, a, dt_bias, b, scale):
    return gdn_decode_splitv(q, k, v, state, A_log, a, dt_bias, b, scale)
