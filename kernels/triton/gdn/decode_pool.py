"""GDN decode in the engines' convention (definitions gdn_decode_packed_*): Triton, one program per
(request, value head, block of BV V rows), the slot check inside the kernel.

    mixed_qkv    [B, (2 HQ + HV) * 128] bf16, per row the q heads, the k heads, the v heads (raw q, k:
                 L2-normalised here, eps 1e-6); any row stride
    a, b         [B, HV] bf16        A_log, dt_bias [HV] fp32
    state_pool   [slots, HV, 128 (V), 128 (K)] fp32, K contiguous, any slot / head / row strides;
                 updated IN PLACE
    state_indices [B] int32: row i's slot; outside [0, slots) a padding row (zero output, no state
                 read or written)
    out          [B, 1, HV, 128] bf16, written

Why a Triton kernel beside the CUDA one (decode_warp_rows.cu): at the largest pools (>= 128 MB of
state) SGLang's Triton packed decode streams the state 1-2% faster than the CUDA kernel in any block
size (benchmarks/results/gdn-packed-H100.json, H100, 2026-11-27), so the routers served SGLang's
kernel there, behind the slot guard's extra launch (~2 us): 0.98x the bare kernel. This kernel checks
its slots itself (no guard). Its launch shapes (BV rows on 1-2 warps a program) and cache hints are
the configurations the tuner measures; it launches through kernels/triton/launch.py (less host time
than the JIT call, for eager calls).

Layout: a 2-D grid (V-row block fastest, then request x head) and the per-row quantities as [BV]
vectors. A first version took one flat program id and [BV, 1] / [1, K] blocks (keep_dims sums):
32 rows on one warp then ran at half SGLang's speed; in this form the same launch shape runs within
1% of SGLang's kernel (H100, 2026-11-28, qk16_v32 and qk2_v4, 1-512 requests, a scratch comparison
in one run).

Per (request, head): g = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b), then for each
V row r: S = g * state[r]; state[r] = S + beta * (v[r] - S . k) * k; out[r] = scale * state[r] . q.
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

from kdispatch.definitions.gdn.names import PACKED_HEADS, packed_name
from kdispatch.kernels.triton.launch import launch
from kdispatch.registry import variant

DIM = 128


@triton.jit
def _gdn_decode_pool_kernel(
    qkv_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, pool_ptr, slots_ptr, out_ptr,
    scale, num_slots,
    s_row, s_ab, s_bb,  # row strides (elements) of mixed_qkv, a and b
    s_slot, s_head, s_vrow,  # the pool's slot, head and V-row strides; K is contiguous
    HQ: tl.constexpr, HV: tl.constexpr, D: tl.constexpr, BV: tl.constexpr, STREAM: tl.constexpr,
):
    i_vb = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_h = i_bh % HV
    i_b = (i_bh // HV).to(tl.int64)
    i_hq = i_h // (HV // HQ)
    offs_k = tl.arange(0, D)
    offs_v = i_vb * BV + tl.arange(0, BV)
    o_ptrs = out_ptr + (i_b * HV + i_h) * D + offs_v

    slot = tl.load(slots_ptr + i_b).to(tl.int64)
    if (slot < 0) | (slot >= num_slots):  # padding: zero output, the pool untouched
        tl.store(o_ptrs, tl.zeros([BV], dtype=tl.float32).to(out_ptr.dtype.element_ty))
        return
    # the state block first (the only large load), read and written once; STREAM: evict-first load,
    # streaming store
    s_ptrs = pool_ptr + slot * s_slot + i_h * s_head + offs_v[:, None] * s_vrow + offs_k[None, :]
    if STREAM:
        S = tl.load(s_ptrs, eviction_policy="evict_first")
    else:
        S = tl.load(s_ptrs)

    row = qkv_ptr + i_b * s_row
    q = tl.load(row + i_hq * D + offs_k).to(tl.float32)
    k = tl.load(row + (HQ + i_hq) * D + offs_k).to(tl.float32)
    v = tl.load(row + (2 * HQ + i_h) * D + offs_v).to(tl.float32)
    q = scale * q / tl.sqrt(tl.sum(q * q) + 1e-6)
    k = k / tl.sqrt(tl.sum(k * k) + 1e-6)

    x = tl.load(a_ptr + i_b * s_ab + i_h).to(tl.float32) + tl.load(dt_bias_ptr + i_h)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))  # torch's threshold
    g = tl.exp(-tl.exp(tl.load(A_log_ptr + i_h)) * softplus)
    beta = tl.sigmoid(tl.load(b_ptr + i_b * s_bb + i_h).to(tl.float32))

    S = S * g
    delta = beta * (v - tl.sum(S * k[None, :], 1))  # [BV]
    S = S + delta[:, None] * k[None, :]
    o = tl.sum(S * q[None, :], 1)
    if STREAM:
        tl.store(s_ptrs, S, cache_modifier=".cs")
    else:
        tl.store(s_ptrs, S)
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty))


def gdn_decode_pool(mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out, scale, *, rows: int,
                    warps: int, stream: bool = False):
    """One decode step over the pool, `rows` V rows and `warps` warps a program (`stream`: cache hints
    for the state). Returns (out, state_pool), both written in place."""
    B, HV = a.shape
    if B == 0:
        return out, state_pool
    HQ = (mixed_qkv.shape[1] - HV * DIM) // (2 * DIM)
    if state_pool.stride(-1) != 1 or mixed_qkv.stride(-1) != 1:
        raise ValueError("gdn_decode_pool: the pool's K axis and the packed rows must be contiguous")
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        a, b = a.contiguous(), b.contiguous()
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(DIM)
    sp = state_pool.stride()
    launch(_gdn_decode_pool_kernel, (DIM // rows, B * HV),
           mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out, float(scale), state_pool.shape[0],
           mixed_qkv.stride(0), a.stride(0), b.stride(0), sp[0], sp[1], sp[2], HQ, HV, DIM, rows, stream,
           num_warps=warps)
    return out, state_pool


# (V rows, warps) a program, "cs": the streaming cache hints. Up to 32 rows on one warp (SGLang's
# launch shape, 128 fp32 state registers a thread), down to 8: the scratch comparison's best at some
# batch size (v32w1cs, v32w2, v16w2cs, v8w1cs), SGLang's own shape (v32w1) and 16 rows on one warp
CONFIGS = {f"v{rows}w{warps}{'cs' if stream else ''}": dict(rows=rows, warps=warps, stream=stream)
           for rows, warps, stream in ((32, 1, False), (32, 1, True), (32, 2, False), (16, 2, True),
                                       (16, 1, True), (8, 1, True))}
for _hq, _hv in PACKED_HEADS.values():
    variant(packed_name(_hq, _hv), "triton_decode_pool", backend="triton", archs=("sm90",), requires=("triton",),
            configs=CONFIGS, strided=True)(gdn_decode_pool)
