"""GDN prefill, chunked in two stages: the state-independent algebra of every 16-token chunk at once,
then each sequence's walk through its chunks with the state in registers.

Definitions: gdn_prefill_pool_* (the engines' convention), gdn_prefill_gathered_* (vLLM's gathered
states as a pool of identity slots, as prefill_gathered.py serves the other kernels) and
gdn_prefill_qk4_v8_d128_k_last (the contest's). The algebra is
prefill_fused.py's (its docstring has the formulas); what differs is where it runs. The fused
kernel computes T, P and the decays inside the walk, one chunk after another, and again in each of a
head's 128 / BV programs; removing each from the fused kernel (a scratch run, H200, 2026-11-30) put
the inverse, the decays and the normalisation at 35-60% of a walk step. Here `_chunk_algebra_kernel`
computes them once per chunk and value head, every chunk in parallel, and `_walk_kernel` is left with
the products that need the state:

    X = V - diag(Gamma rk) K S0^T,   R = (T diag(beta)) X,
    O = diag(scale Gamma rq) Q S0^T + P R,   S^T = exp(G_end) S0^T + (diag(exp(G_end - G) rk) K)^T R,

rk, rq the inverse L2 norms of the k and q rows (ones in the contest's convention, whose q/k come
normalised), P = scale (Q K^T * exp(G_i - G_j))_{j <= i} with the norms folded in. Chunks are the
16-token blocks of the packed batch cut at sequence boundaries, so the first stage's grid is known
without reading cu_seqlens on the host; a block holding pieces of several sequences masks every
matrix to pairs of tokens of the same sequence, and G restarts where a sequence starts. The stages
pass per chunk and value head T diag(beta) and P (bf16, 2 x 16 x 16) and four per-token factors
(fp32): 80 bytes a token and value head, written once and read by each of the head's 128 / BV walk
programs, against the ~770 of q/k/v and the output.

Device-side checks as prefill_fused.py (no host sync, CUDA-graph safe): a malformed batch writes a
zero output and no state; a sequence whose slot is outside the pool writes zeros and touches no
state (the first stage's values for such batches are never read). DOT_FP32: under the interpreter the
bf16 operands and the stages' matrices stay fp32 (prefill_chunked.py).

Where it stands: benchmarks/results/gdn-fused-grid-H200.txt (graph replays over 8 input sets) times it
beside the fused kernel, the baseline and kernels/cuda/gdn/prefill_walk.py, which runs this first
launch with a CUDA walk (1.03-1.36x this walk there).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, all_true, gathered_prefill_name, identity_slots
from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.kernels.triton.gdn.decode_splitv import _resolve_scale
from kdispatch.kernels.triton.gdn.prefill_chunked import (CU_BLOCK, DIM, TRI_PRECISION, _batch_ok, _low,
                                                           _segments)
from kdispatch.kernels.triton.gdn.prefill_fused import _gate_values, _unit_lower_inverse
from kdispatch.kernels.triton.launch import launch
from kdispatch.registry import variant

CHUNK = 16  # tokens a chunk: 32 and 64 made the walk 1.2-3x slower (a scratch run, H200, 2026-11-30)
# of _chunk_algebra_kernel: alone 44 us at 1 warp, 64 at 2, 88 at 4 (32 heads, 64 x 4,096 tokens, H200,
# a scratch run)
ALGEBRA_WARPS = 1
FACTORS = 4  # per token: Gamma rk, scale Gamma rq, exp(G_end - G) rk, exp(G_end)


@triton.jit
def _chunk_algebra_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, cu_ptr, mats_ptr, fac_ptr,
    scale, T, N, s_qt, s_qh, s_kt, s_kh, s_gt, s_bt,
    HV: tl.constexpr, HQK: tl.constexpr, C: tl.constexpr, LOG_C: tl.constexpr, NORM: tl.constexpr,
    RAW_GATES: tl.constexpr, CU_BLOCK: tl.constexpr, DOT_FP32: tl.constexpr, PREC: tl.constexpr,
):
    """One program per (C-token block of the packed batch, q/k head), for each value head of that q/k
    head: T diag(beta) and P of the block's sequence pieces, and the four factors of each token."""
    i_b = tl.program_id(0)
    i_hk = tl.program_id(1)
    c = tl.arange(0, C)
    kk = tl.arange(0, 128)
    rows = i_b * C + c
    valid = rows < T
    r64 = rows.to(tl.int64)
    seg = _segments(cu_ptr, N, rows, CU_BLOCK)
    same = (seg[:, None] == seg[None, :]) & valid[:, None] & valid[None, :]
    causal = same & (c[None, :] <= c[:, None])
    lower = same & (c[None, :] < c[:, None])
    K = tl.load(k_ptr + r64[:, None] * s_kt + i_hk * s_kh + kk[None, :], mask=valid[:, None], other=0.0)
    Q = tl.load(q_ptr + r64[:, None] * s_qt + i_hk * s_qh + kk[None, :], mask=valid[:, None], other=0.0)
    Kl = _low(K, DOT_FP32)
    Ql = _low(Q, DOT_FP32)
    kk0 = tl.dot(Kl, tl.trans(Kl))
    if NORM:
        # the inverse norms from the Gram matrices' diagonals: the row reductions over 128 columns they
        # replace kept K and Q live in fp32 (first launch 43.8 -> 30.8 us, 235 -> 168 registers, 32 heads,
        # 64 x 4,096 tokens, H200, a scratch run)
        eye = c[:, None] == c[None, :]
        rk = 1.0 / tl.sqrt(tl.sum(tl.where(eye, kk0, 0.0), axis=1) + 1e-6)
        rq = 1.0 / tl.sqrt(tl.sum(tl.where(eye, tl.dot(Ql, tl.trans(Ql)), 0.0), axis=1) + 1e-6)
    else:
        rk = tl.full([C], 1.0, tl.float32)
        rq = tl.full([C], 1.0, tl.float32)
    kkt = kk0 * rk[:, None] * rk[None, :]
    qkt = tl.dot(Ql, tl.trans(Kl)) * (scale * rq)[:, None] * rk[None, :]
    cc = c[:, None] * C + c[None, :]
    for j in tl.static_range(HV // HQK):
        i_h = i_hk * (HV // HQK) + j
        g, beta = _gate_values(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, r64, valid, i_h, s_gt, s_bt, RAW_GATES)
        G = tl.sum(tl.where(causal, g[None, :], 0.0), axis=1)  # from the first token of the row's piece
        G_end = tl.sum(tl.where(same, g[None, :], 0.0), axis=1)  # the row's piece's total
        decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))
        A = tl.where(lower, kkt * beta[:, None] * decay, 0.0)
        TB = _unit_lower_inverse(A, C, LOG_C, PREC) * beta[None, :]
        mat = mats_ptr + (i_b * HV + i_h).to(tl.int64) * (2 * C * C)
        tl.store(mat + cc, TB.to(mats_ptr.dtype.element_ty))
        tl.store(mat + C * C + cc, (qkt * decay).to(mats_ptr.dtype.element_ty))
        gam = tl.exp(G)
        fac = fac_ptr + (i_b * HV + i_h).to(tl.int64) * (4 * C) + c
        tl.store(fac, gam * rk)
        tl.store(fac + C, scale * gam * rq)
        tl.store(fac + 2 * C, tl.exp(G_end - G) * rk)
        tl.store(fac + 3 * C, tl.exp(G_end))


@triton.jit
def _block_loads(q_ptr, k_ptr, v_ptr, mats_ptr, fac_ptr, b, bos, eos, i_h, i_hk, offs_v, s_qt, s_qh, s_kt, s_kh,
                 s_vt, s_vh, HV: tl.constexpr, C: tl.constexpr):
    """What the walk reads for its piece of block b (zeros outside the piece's rows)."""
    c = tl.arange(0, C)
    kk = tl.arange(0, 128)
    rows = b * C + c
    m = (rows >= bos) & (rows < eos)
    r64 = rows.to(tl.int64)
    K = tl.load(k_ptr + r64[:, None] * s_kt + i_hk * s_kh + kk[None, :], mask=m[:, None], other=0.0)
    Q = tl.load(q_ptr + r64[:, None] * s_qt + i_hk * s_qh + kk[None, :], mask=m[:, None], other=0.0)
    V = tl.load(v_ptr + r64[:, None] * s_vt + i_h * s_vh + offs_v[None, :], mask=m[:, None], other=0.0)
    cc = c[:, None] * C + c[None, :]
    mat = mats_ptr + (b * HV + i_h) * (2 * C * C)
    TB = tl.load(mat + cc, mask=m[:, None], other=0.0)
    P = tl.load(mat + C * C + cc, mask=m[:, None], other=0.0)
    fac = fac_ptr + (b * HV + i_h) * (4 * C) + c
    ak = tl.load(fac, mask=m, other=0.0)
    aq = tl.load(fac + C, mask=m, other=0.0)
    ek = tl.load(fac + 2 * C, mask=m, other=0.0)
    eg = tl.max(tl.load(fac + 3 * C, mask=m, other=0.0), axis=0)
    return K, Q, V, TB, P, ak, aq, ek, eg


@triton.jit
def _walk_kernel(
    q_ptr, k_ptr, v_ptr, mats_ptr, fac_ptr, state_ptr, slot_ptr, init_ptr, cu_ptr, out_ptr,
    T, N, num_slots,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh,  # token and head strides (elements)
    s_sn, s_sh, s_sv,  # state slot, head, V row strides
    HV: tl.constexpr, HQK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr,
    SLOTS: tl.constexpr,  # the pool convention: slot_ptr / init_ptr per sequence; else state n is sequence n's
    HAS_STATE: tl.constexpr,  # without SLOTS: whether the initial states are read (else zeros)
    CU_BLOCK: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """One program per (sequence, value head, BV rows of V): the sequence's pieces of blocks in order."""
    NVB: tl.constexpr = 128 // BV
    pid = tl.program_id(0)
    i_vb = pid % NVB
    i_h = (pid // NVB) % HV
    i_n = (pid // NVB // HV).to(tl.int64)
    i_hk = i_h // (HV // HQK)
    offs_v = i_vb * BV + tl.arange(0, BV)
    kk = tl.arange(0, 128)
    c = tl.arange(0, C)
    o_base = out_ptr + i_h * 128 + offs_v[None, :]

    ok = _batch_ok(cu_ptr, N, T, CU_BLOCK)
    if SLOTS:
        slot = tl.load(slot_ptr + i_n).to(tl.int64)
        live = (slot >= 0) & (slot < num_slots)
    else:
        slot = i_n
        live = i_n >= 0
    bos = tl.load(cu_ptr + i_n).to(tl.int64)
    eos = tl.load(cu_ptr + i_n + 1).to(tl.int64)
    # A malformed batch zeroes rows [n T / N, (n + 1) T / N) of this head and V block, a padding
    # sequence its own rows; neither reads or writes a state.
    lo = tl.where(ok, bos, i_n * T // N)
    hi = tl.where(ok, eos, (i_n + 1) * T // N)
    if not (ok & live):
        for t0 in range(lo, hi, C):
            r = t0 + c
            tl.store(o_base + r[:, None].to(tl.int64) * (HV * 128), tl.zeros([C, BV], dtype=tl.bfloat16),
                     mask=(r < hi)[:, None])
    else:
        s_ptrs = state_ptr + slot * s_sn + i_h * s_sh + offs_v[None, :] * s_sv + kk[:, None]  # S^T: [K, BV]
        if SLOTS:
            if tl.load(init_ptr + i_n).to(tl.int32) != 0:  # a fresh sequence reads no state
                S = tl.load(s_ptrs)
            else:
                S = tl.zeros([128, BV], dtype=tl.float32)
        elif HAS_STATE:
            S = tl.load(s_ptrs)
        else:
            S = tl.zeros([128, BV], dtype=tl.float32)
        b0 = bos // C
        # each block's loads are issued before the previous block's products (DRAM latency)
        nK, nQ, nV, nTB, nP, nak, naq, nek, neg = _block_loads(q_ptr, k_ptr, v_ptr, mats_ptr, fac_ptr, b0, bos, eos,
                                                               i_h, i_hk, offs_v, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh,
                                                               HV, C)
        b1 = tl.where(eos > bos, (eos + C - 1) // C, b0)  # an empty sequence has no piece (and keeps its state)
        for b in range(b0, b1):
            rows = b * C + c
            m = (rows >= bos) & (rows < eos)
            r64 = rows.to(tl.int64)
            K, Q, V, TB, P, ak, aq, ek, eg = nK, nQ, nV, nTB, nP, nak, naq, nek, neg
            nK, nQ, nV, nTB, nP, nak, naq, nek, neg = _block_loads(q_ptr, k_ptr, v_ptr, mats_ptr, fac_ptr, b + 1, bos,
                                                                   eos, i_h, i_hk, offs_v, s_qt, s_qh, s_kt, s_kh,
                                                                   s_vt, s_vh, HV, C)
            Kl = _low(K, DOT_FP32)
            Sl = _low(S, DOT_FP32)
            X = V.to(tl.float32) - ak[:, None] * tl.dot(Kl, Sl)
            R = _low(tl.dot(_low(TB, DOT_FP32), _low(X, DOT_FP32)), DOT_FP32)
            O = aq[:, None] * tl.dot(_low(Q, DOT_FP32), Sl) + tl.dot(_low(P, DOT_FP32), R)
            tl.store(o_base + r64[:, None] * (HV * 128), O.to(tl.bfloat16), mask=m[:, None])
            Kt = _low(K.to(tl.float32) * ek[:, None], DOT_FP32)
            S = eg * S + tl.dot(tl.trans(Kt), R)
        tl.store(s_ptrs, S)


# (C tokens a chunk, BV state rows a walk program, warps). H200 (gdn-fused-grid-H200.txt): 64 rows a
# program fastest from ~64 (sequence, head) pairs, 32 for fewer, 128 at 8 warps never; the tuner
# measures each.
LAUNCH_CONFIGS = {"c16v32": dict(cfg=(16, 32, 4)), "c16v64": dict(cfg=(16, 64, 4))}


def config(num_seqs: int, num_v_heads: int) -> tuple[int, int, int]:
    """Default (C, BV, warps) of a direct call."""
    return (16, 32, 4) if num_seqs * num_v_heads <= 64 else (16, 64, 4)


def chunk_algebra(q, k, gates, cu_seqlens, HV: int, scale: float, *, raw_gates: bool, norm: bool):
    """The first launch: (matrices, factors) of every 16-token block and value head, the buffers a walk
    reads (bf16 matrices; fp32 under the interpreter). `gates` = (g, beta, A_log, dt_bias) as `_staged`."""
    T, HQK, _ = q.shape
    N = cu_seqlens.shape[0] - 1
    g, beta, A_log, dt_bias = gates
    g = g if g.stride(-1) == 1 else g.contiguous()
    beta = beta if beta.stride(-1) == 1 else beta.contiguous()
    interpreted = q.device.type != "cuda"
    blocks = -(-T // CHUNK)  # not triton.cdiv: a constexpr function, a few us of host time a call
    mats = torch.empty(max(blocks, 1) * HV * 2 * CHUNK * CHUNK, device=q.device,
                       dtype=torch.float32 if interpreted else torch.bfloat16)
    factors = torch.empty(max(blocks, 1) * HV * FACTORS * CHUNK, dtype=torch.float32, device=q.device)
    if blocks:
        launch(_chunk_algebra_kernel, (blocks, HQK), q, k, g, beta, A_log if raw_gates else g,
               dt_bias if raw_gates else g, cu_seqlens, mats, factors, scale, T, N, q.stride(0), q.stride(1),
               k.stride(0), k.stride(1), g.stride(0), beta.stride(0), HV, HQK, CHUNK, CHUNK.bit_length() - 1, norm,
               raw_gates, CU_BLOCK, interpreted, TRI_PRECISION, num_warps=ALGEBRA_WARPS, num_stages=2)
    return mats, factors


def _staged(q, k, v, gates, state, slots, init, cu_seqlens, out, scale, *, raw_gates, norm, has_state, cfg):
    """Two launches; arguments as prefill_fused._fused."""
    T, HQK, _ = q.shape
    HV = v.shape[1]
    N = cu_seqlens.shape[0] - 1
    if N <= 0:
        return
    chunk, bv, warps = cfg or config(N, HV)
    if chunk != CHUNK:
        raise ValueError(f"triton_prefill_staged: chunk length {chunk} is not {CHUNK}")
    mats, factors = chunk_algebra(q, k, gates, cu_seqlens, HV, scale, raw_gates=raw_gates, norm=norm)
    pooled = slots is not None
    ss = state.stride()
    launch(_walk_kernel, (N * HV * (DIM // bv),), q, k, v, mats, factors, state,
           slots if pooled else cu_seqlens, init if pooled else cu_seqlens, cu_seqlens, out,
           T, N, state.shape[0], q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
           ss[0], ss[1], ss[2], HV, HQK, bv, chunk, pooled, has_state, CU_BLOCK, q.device.type != "cuda",
           num_warps=warps, num_stages=2)


def _checked(q, k, v, out, state):
    for name, t in (("q", q), ("k", k), ("v", v), ("state", state)):
        if t.stride(-1) != 1:
            raise ValueError(f"triton_prefill_staged: {name} needs a contiguous last dimension")
    if out.stride() != (out.shape[1] * DIM, DIM, 1):
        raise ValueError("triton_prefill_staged: out must be contiguous")


def gdn_prefill_pool_staged(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out,
                            scale, cfg: tuple[int, int, int] | None = None):
    """The engines' prefill (gdn_prefill_pool_*), staged. Returns (out, state_pool)."""
    _checked(q, k, v, out, state_pool)
    _staged(q, k, v, (g, beta, None, None), state_pool, state_indices, has_initial_state, cu_seqlens, out,
            _resolve_scale(scale, DIM), raw_gates=False, norm=True, has_state=True, cfg=cfg)
    return out, state_pool


def gdn_prefill_staged(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                       cfg: tuple[int, int, int] | None = None):
    """The contest's prefill (gdn_prefill_qk4_v8_d128_k_last), staged: the final states are written into
    `state` in place (a new zero state when None). Returns (out, state)."""
    T, HV, N = q.shape[0], v.shape[1], cu_seqlens.shape[0] - 1
    given = state is not None
    if not given:
        state = torch.zeros(N, HV, DIM, DIM, dtype=torch.float32, device=q.device)
    out = torch.empty(T, HV, DIM, dtype=torch.bfloat16, device=q.device)
    _checked(q, k, v, out, state)
    _staged(q, k, v, (a, b, A_log.contiguous(), dt_bias.contiguous()), state, None, None, cu_seqlens, out,
            _resolve_scale(scale, DIM), raw_gates=True, norm=False, has_state=given, cfg=cfg)
    return out, state


def gdn_prefill_gathered_staged(q, k, v, g, beta, initial_state, cu_seqlens, out, scale, cfg=None):
    """vLLM's gathered states as a pool of one slot per sequence (prefill_gathered.py)."""
    n = initial_state.shape[0]
    return gdn_prefill_pool_staged(q, k, v, g, beta, initial_state, identity_slots(n, q.device), all_true(n, q.device),
                                   cu_seqlens, out, scale, cfg=cfg)


variant("gdn_prefill", "triton_prefill_staged", backend="triton", archs=("sm90",), requires=("triton",),
        configs=LAUNCH_CONFIGS)(gdn_prefill_staged)
for _hq, _hv in PACKED_HEADS.values():
    variant(pool_prefill_name(_hq, _hv), "triton_prefill_staged", backend="triton", archs=("sm90",),
            requires=("triton",), configs=LAUNCH_CONFIGS, strided=True)(gdn_prefill_pool_staged)
for _hq, _hv in GATHERED_HEADS.values():
    variant(gathered_prefill_name(_hq, _hv), "triton_prefill_staged", backend="triton", archs=("sm90",),
            requires=("triton",), configs=LAUNCH_CONFIGS, strided=True)(gdn_prefill_gathered_staged)
