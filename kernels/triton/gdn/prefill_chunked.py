"""GDN prefill, chunked: two Triton kernels that do the delta rule 64 tokens at a time on tensor cores.

Definitions: gdn_prefill_pool_* (the engines' convention: q/k L2-normalised here, gates activated by
the engine, states in a pool of slots updated in place) and gdn_prefill_qk4_v8_d128_k_last (the
contest's: raw gates, a state per sequence).

Within a chunk of tokens of one sequence, with G the cumulative log decay from the chunk start
(Gamma = exp(G)), S0 the state at the chunk start ([V, K], k-last) and the residual
r_t = beta_t (v_t - exp(g_t) S_{t-1} k_t) of each token, unrolling the recurrence gives

    R = U - W S0^T,  U = T diag(beta) V,  W = T diag(beta Gamma) K,
    T = (I + strictly_lower(diag(beta) (K K^T) * exp(G_i - G_j)))^-1,
    O = scale (diag(Gamma) Q S0^T + (Q K^T * exp(G_i - G_j), j <= i) R) = O0 + Q' S0^T,
    S_C = exp(G_C) S0 + (R * exp(G_C - G))^T K.

Everything but S0 is known up front, so `_wy_kernel` (one program per 64-token block of the packed
batch and value head) computes T, W, U, Q' = scale diag(Gamma) Q - P W and O0 = P U (P the masked,
scaled Q K^T), and the decayed keys, for every block at once. A block may hold the tail of one
sequence and the heads of others: every matrix is masked to pairs of tokens of the same sequence and
G restarts where a sequence starts, so each (block, sequence) piece is a chunk of its own. T goes
through scratch in 16 x 16 blocks (diagonal inverses by forward substitution, the rest by small
products, as fla's solve_tril). The bf16 tensor-core products (fp32 accumulate) take q and k as given
and scale by their inverse norms.

`_scan_kernel` then walks each sequence's pieces in order, one program per (sequence, value head,
BV rows of V) with S^T [K, BV] in registers: three products a piece (W S^T, Q' S^T, the update). Its
time grows with the longest sequence's number of blocks (~64x fewer steps than a token-by-token
recurrence), its work with the tokens. Both kernels check cu_seqlens on the device (no host sync,
CUDA-graph safe): a malformed batch writes a zero output and no state; a sequence whose slot is
outside the pool writes zeros and touches no state.

Where it stands (H100, benchmarks/gdn_chunked_profile.py, 8 value heads, graph replays, 2026-11-26):
the block kernel is latency-bound at ~20 us a program (one wave up to ~16 blocks x 8 heads), the scan
~2 us a piece; a whole call ~30 us from 64 to ~500 tokens, where the recurrence
(cuda_prefill_pool_rows) wins on short sequences and FlashInfer on many blocks. The scan at
num_stages=1 faults (Triton 3.6); it runs at 2, clean under compute-sanitizer.

DOT_FP32: Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) multiplies the raw bits in a
bf16 x bf16 tl.dot, so off CUDA the bf16 operands stay fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.kernels.triton.gdn.decode_splitv import _resolve_scale
from kdispatch.kernels.triton.launch import launch
from kdispatch.registry import variant

CHUNK = 64
DIM = 128
CU_BLOCK = 256  # cu_seqlens entries examined per vector step
TRI_PRECISION = "tf32"  # of the inverse's products (T is stored in bf16; tf32x3 measured no closer)


@triton.jit
def _segments(cu_ptr, N, rows, CU_BLOCK: tl.constexpr):
    """Per row: how many sequence boundaries cu[1..N] lie at or before it (its sequence index)."""
    seg = tl.zeros(rows.shape, dtype=tl.int32)
    for c0 in range(0, N + 1, CU_BLOCK):
        offs = c0 + tl.arange(0, CU_BLOCK)
        cu = tl.load(cu_ptr + offs, mask=(offs >= 1) & (offs <= N), other=2147483647).to(tl.int64)
        seg += tl.sum((cu[None, :] <= rows[:, None]).to(tl.int32), axis=1)
    return seg


@triton.jit
def _batch_ok(cu_ptr, N, T, CU_BLOCK: tl.constexpr):
    """0 = cu[0] <= cu[1] <= ... <= cu[N] = T."""
    bad = 0
    for c0 in range(0, N + 1, CU_BLOCK):
        offs = c0 + tl.arange(0, CU_BLOCK)
        cu = tl.load(cu_ptr + offs, mask=offs <= N, other=0).to(tl.int64)
        prev = tl.load(cu_ptr + offs - 1, mask=(offs >= 1) & (offs <= N), other=0).to(tl.int64)
        b = ((offs == 0) & (cu != 0)) | ((offs <= N) & (cu < prev)) | ((offs == N) & (cu != T))
        bad += tl.sum(b.to(tl.int32), axis=0)
    return bad == 0


@triton.jit
def _low(x, DOT_FP32: tl.constexpr):
    """A tl.dot operand in bf16 (fp32 accumulate), or fp32 under the interpreter (see the docstring)."""
    if DOT_FP32:
        return x.to(tl.float32)
    return x.to(tl.bfloat16)


@triton.jit
def _rnorm(x, NORM: tl.constexpr):
    """1 / L2 norm of each row of x (the reference's q / sqrt(sum q^2 + 1e-6)); ones without NORM.
    The kernels scale dot products by it instead of normalising the bf16 operands."""
    xf = x.to(tl.float32)
    if NORM:
        return 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) + 1e-6)
    return tl.sum(xf * 0.0, axis=1) + 1.0


@triton.jit
def _sub(a_ptr, row0, col0, T, i_h, HV: tl.constexpr):
    """The 16 x 16 block of the scratch A at block rows row0.., in-block columns col0.."""
    r = row0 + tl.arange(0, 16)
    return tl.load(a_ptr + r.to(tl.int64)[:, None] * (HV * 64) + i_h * 64 + col0 + tl.arange(0, 16)[None, :],
                   mask=(r < T)[:, None], other=0.0)


@triton.jit
def _put(t_ptr, X, row0, col0, T, i_h, HV: tl.constexpr):
    r = row0 + tl.arange(0, 16)
    tl.store(t_ptr + r.to(tl.int64)[:, None] * (HV * 64) + i_h * 64 + col0 + tl.arange(0, 16)[None, :],
             X.to(tl.bfloat16), mask=(r < T)[:, None])


@triton.jit
def _diag_inverses(a_ptr, r0, T, i_h, HV: tl.constexpr):
    """(I + A_dd)^-1 of the four strictly lower 16 x 16 diagonal blocks of the scratch A at block rows
    r0.., written over them. Forward substitution for all four at once: row (d, r) of a [64, 16] tile
    holds row r of block d's inverse transposed (Y_d = X_d^T), built column by column,
    Y_d[:, i] = e_i - sum_{j<i} Y_d[:, j] A_d[i, j]: 15 steps of one row-wise reduction each."""
    rr = tl.arange(0, 64)
    d16 = (rr // 16) * 16  # the row's block, times 16
    r = rr % 16
    j = tl.arange(0, 16)
    Y = (r[:, None] == j[None, :]).to(tl.float32)
    for i in tl.static_range(1, 16):
        row = (r0 + d16 + i).to(tl.int64)  # block d's row i, for every row of the tile
        a = tl.load(a_ptr + row[:, None] * (HV * 64) + i_h * 64 + d16[:, None] + j[None, :],
                    mask=(j[None, :] < i) & (row[:, None] < T), other=0.0)
        y = (r == i).to(tl.float32) - tl.sum(Y * a, axis=1)
        Y = tl.where(j[None, :] == i, y[:, None], Y)
    tl.debug_barrier()  # every row of A_dd read before any is overwritten
    rows = (r0 + d16[:, None] + j[None, :]).to(tl.int64)  # X_d[c, r] = Y_d[r, c]
    tl.store(a_ptr + rows * (HV * 64) + i_h * 64 + d16[:, None] + r[:, None], Y, mask=rows < T)


@triton.jit
def _gates(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, cu_ptr, rows, N, T, i_h, s_gt, s_bt,
           RAW_GATES: tl.constexpr, CU_BLOCK: tl.constexpr):
    """For the 64 rows of a block: which pairs belong to one sequence, G (the log decay summed from
    the row's piece start, inclusive), G_end (the sum over the row's whole piece) and beta."""
    valid = rows < T
    seg = _segments(cu_ptr, N, rows, CU_BLOCK)
    if RAW_GATES:  # the contest's: log decay -exp(A_log) softplus(a + dt_bias), beta sigmoid(b)
        x = tl.load(g_ptr + rows * s_gt + i_h, mask=valid, other=0.0).to(tl.float32) + tl.load(dt_bias_ptr + i_h)
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        g = -tl.exp(tl.load(A_log_ptr + i_h)) * softplus
        beta = 1.0 / (1.0 + tl.exp(-tl.load(beta_ptr + rows * s_bt + i_h, mask=valid, other=0.0).to(tl.float32)))
    else:
        g = tl.load(g_ptr + rows * s_gt + i_h, mask=valid, other=0.0)
        beta = tl.load(beta_ptr + rows * s_bt + i_h, mask=valid, other=0.0)
    g = tl.where(valid, g, 0.0)
    beta = tl.where(valid, beta, 0.0)
    c = tl.arange(0, 64)
    same = seg[:, None] == seg[None, :]
    G = tl.sum(tl.where(same & (c[None, :] <= c[:, None]), g[None, :], 0.0), axis=1)
    G_end = tl.sum(tl.where(same, g[None, :], 0.0), axis=1)
    return same, G, G_end, beta


@triton.jit
def _block_inverse(a_ptr, t_ptr, r0, T, i_h, HV: tl.constexpr, PREC: tl.constexpr):
    """T = (I + A)^-1 of the strictly lower 64 x 64 A in fp32 scratch at block rows r0.., to bf16
    scratch: the four diagonal 16 x 16 inverses by forward substitution (in place in the scratch),
    then the six blocks below them by 16 x 16 products (as fla's solve_tril); the blocks above are
    never written (_wy_kernel masks them out)."""
    _diag_inverses(a_ptr, r0, T, i_h, HV)
    tl.debug_barrier()
    X00 = _sub(a_ptr, r0, 0, T, i_h, HV)
    X11 = _sub(a_ptr, r0 + 16, 16, T, i_h, HV)
    X22 = _sub(a_ptr, r0 + 32, 32, T, i_h, HV)
    X33 = _sub(a_ptr, r0 + 48, 48, T, i_h, HV)
    A10 = _sub(a_ptr, r0 + 16, 0, T, i_h, HV)
    A20 = _sub(a_ptr, r0 + 32, 0, T, i_h, HV)
    A21 = _sub(a_ptr, r0 + 32, 16, T, i_h, HV)
    A30 = _sub(a_ptr, r0 + 48, 0, T, i_h, HV)
    A31 = _sub(a_ptr, r0 + 48, 16, T, i_h, HV)
    A32 = _sub(a_ptr, r0 + 48, 32, T, i_h, HV)
    # X_ij = -X_ii sum_{j <= k < i} A_ik X_kj
    X10 = -tl.dot(X11, tl.dot(A10, X00, input_precision=PREC), input_precision=PREC)
    X21 = -tl.dot(X22, tl.dot(A21, X11, input_precision=PREC), input_precision=PREC)
    X20 = -tl.dot(X22, tl.dot(A20, X00, input_precision=PREC) + tl.dot(A21, X10, input_precision=PREC),
                  input_precision=PREC)
    X32 = -tl.dot(X33, tl.dot(A32, X22, input_precision=PREC), input_precision=PREC)
    X31 = -tl.dot(X33, tl.dot(A31, X11, input_precision=PREC) + tl.dot(A32, X21, input_precision=PREC),
                  input_precision=PREC)
    X30 = -tl.dot(X33, tl.dot(A30, X00, input_precision=PREC) + tl.dot(A31, X10, input_precision=PREC)
                  + tl.dot(A32, X20, input_precision=PREC), input_precision=PREC)
    _put(t_ptr, X00, r0, 0, T, i_h, HV)
    _put(t_ptr, X10, r0 + 16, 0, T, i_h, HV)
    _put(t_ptr, X11, r0 + 16, 16, T, i_h, HV)
    _put(t_ptr, X20, r0 + 32, 0, T, i_h, HV)
    _put(t_ptr, X21, r0 + 32, 16, T, i_h, HV)
    _put(t_ptr, X22, r0 + 32, 32, T, i_h, HV)
    _put(t_ptr, X30, r0 + 48, 0, T, i_h, HV)
    _put(t_ptr, X31, r0 + 48, 16, T, i_h, HV)
    _put(t_ptr, X32, r0 + 48, 32, T, i_h, HV)
    _put(t_ptr, X33, r0 + 48, 48, T, i_h, HV)


@triton.jit
def _wy_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, cu_ptr, a_ptr, t_ptr,
    w_ptr, u_ptr, qp_ptr, kt_ptr, ge_ptr, out_ptr, scale, T, N,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_bt,  # token and head strides (elements); gates: head stride 1
    HV: tl.constexpr, HQK: tl.constexpr, NORM: tl.constexpr, RAW_GATES: tl.constexpr,
    CU_BLOCK: tl.constexpr, DOT_FP32: tl.constexpr, PREC: tl.constexpr,
):
    """Everything of a (block, value head) that does not depend on the state, so that the scan is two
    products with S0^T and one update per piece (rows of a piece, Gamma = exp(G), P = scale (Q K^T
    * exp(G_i - G_j))_{j <= i}, one sequence):
        W = T diag(beta Gamma) K, U = T diag(beta) V                    -> R = U - W S0^T
        Q' = scale diag(Gamma) Q - P W, O0 = P U (into out)             -> O = O0 + Q' S0^T
        K~ = diag(exp(G_end - G)) K, exp(G_end) per row                 -> S' = exp(G_end) S0 + R^T K~
    with T = (I + strictly_lower(diag(beta) K K^T * exp(G_i - G_j)))^-1, masked to pairs of one
    sequence (block-diagonal over the block's pieces); A and T go through scratch so that their
    16 x 16 blocks can be read back. q and k are scaled by their inverse norms on the way; W, U, Q',
    K~ go to bf16 scratch."""
    i_blk = tl.program_id(0)
    i_h = tl.program_id(1)
    i_hk = i_h // (HV // HQK)
    rows = i_blk * 64 + tl.arange(0, 64)
    valid = rows < T
    r64 = rows.to(tl.int64)
    same, G, G_end, beta = _gates(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, cu_ptr, rows, N, T, i_h, s_gt, s_bt,
                                  RAW_GATES, CU_BLOCK)
    tl.store(ge_ptr + r64 * HV + i_h, G_end, mask=valid)
    c = tl.arange(0, 64)
    cols = tl.arange(0, 128)[None, :]
    base = r64[:, None] * (HV * 128) + i_h * 128 + cols
    K = tl.load(k_ptr + r64[:, None] * s_kt + i_hk * s_kh + cols, mask=valid[:, None], other=0.0)
    rk = _rnorm(K, NORM)
    causal = same & (c[None, :] <= c[:, None])
    decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))
    Kl = _low(K, DOT_FP32)
    A = tl.where(causal & (c[None, :] < c[:, None]), tl.dot(Kl, tl.trans(Kl)) * (beta * rk)[:, None] * rk[None, :]
                 * decay, 0.0)
    tl.store(a_ptr + r64[:, None] * (HV * 64) + i_h * 64 + c[None, :], A, mask=valid[:, None])
    tl.debug_barrier()
    _block_inverse(a_ptr, t_ptr, i_blk * 64, T, i_h, HV, PREC)
    tl.debug_barrier()
    Ti = tl.load(t_ptr + r64[:, None] * (HV * 64) + i_h * 64 + c[None, :],  # lower blocks only: none above
                 mask=valid[:, None] & (c[None, :] // 16 <= c[:, None] // 16), other=0.0)
    Ti = _low(Ti, DOT_FP32)
    gam = tl.exp(G)
    tl.store(kt_ptr + base, (K.to(tl.float32) * (rk * tl.exp(G_end - G))[:, None]).to(tl.bfloat16),
             mask=valid[:, None])
    W = _low(tl.dot(Ti, _low(K.to(tl.float32) * (beta * gam * rk)[:, None], DOT_FP32)), DOT_FP32)
    tl.store(w_ptr + base, W.to(tl.bfloat16), mask=valid[:, None])
    Q = tl.load(q_ptr + r64[:, None] * s_qt + i_hk * s_qh + cols, mask=valid[:, None], other=0.0)
    rq = _rnorm(Q, NORM)
    qk = tl.dot(_low(Q, DOT_FP32), tl.trans(Kl))
    P = _low(tl.where(causal, qk * (scale * rq)[:, None] * rk[None, :] * decay, 0.0), DOT_FP32)
    Qp = Q.to(tl.float32) * (scale * gam * rq)[:, None] - tl.dot(P, W)
    tl.store(qp_ptr + base, Qp.to(tl.bfloat16), mask=valid[:, None])
    V = tl.load(v_ptr + r64[:, None] * s_vt + i_h * s_vh + cols, mask=valid[:, None], other=0.0)
    U = _low(tl.dot(Ti, _low(V.to(tl.float32) * beta[:, None], DOT_FP32)), DOT_FP32)
    tl.store(u_ptr + base, U.to(tl.bfloat16), mask=valid[:, None])
    tl.store(out_ptr + base, tl.dot(P, U).to(tl.bfloat16), mask=valid[:, None])


@triton.jit
def _scan_kernel(
    w_ptr, u_ptr, qp_ptr, kt_ptr, ge_ptr, state_ptr, slot_ptr, init_ptr, cu_ptr, out_ptr,
    T, N, num_slots,
    s_sn, s_sh, s_sv,  # state slot, head, V row strides
    HV: tl.constexpr, BV: tl.constexpr,
    SLOTS: tl.constexpr,  # the pool convention: slot_ptr / init_ptr per sequence; else state n is sequence n's
    HAS_STATE: tl.constexpr,  # without SLOTS: whether the initial states are read (else zeros)
    CU_BLOCK: tl.constexpr, DOT_FP32: tl.constexpr,
):
    """One (sequence, value head, BV rows of V): the state S^T [K, BV] in registers (fp32), walked
    over the sequence's pieces, one per 64-token block it touches; `out` holds O0 from _wy_kernel."""
    NVB: tl.constexpr = 128 // BV
    pid = tl.program_id(0)
    i_vb = pid % NVB
    i_h = (pid // NVB) % HV
    i_n = (pid // NVB // HV).to(tl.int64)
    offs_v = i_vb * BV + tl.arange(0, BV)
    kk = tl.arange(0, 128)
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
    if not ok:  # malformed batch: zero rows [n T / N, (n + 1) T / N) of this head and V block, no state
        for t0 in range(i_n * T // N, (i_n + 1) * T // N, 64):
            r = t0 + tl.arange(0, 64)
            tl.store(o_base + r[:, None].to(tl.int64) * (HV * 128), tl.zeros([64, BV], dtype=tl.bfloat16),
                     mask=(r < (i_n + 1) * T // N)[:, None])
    elif not live:  # padding sequence: zero output, no state read or written
        for t0 in range(bos, eos, 64):
            r = t0 + tl.arange(0, 64)
            tl.store(o_base + r[:, None] * (HV * 128), tl.zeros([64, BV], dtype=tl.bfloat16),
                     mask=(r < eos)[:, None])
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
        c = tl.arange(0, 64)
        # an empty sequence walks no block: its state is stored as read, not decayed by a neighbour's gates
        for blk in range(bos // 64, tl.where(eos > bos, (eos + 63) // 64, bos // 64)):
            rows = blk * 64 + c
            m = (rows >= bos) & (rows < eos)
            r64 = rows.to(tl.int64)
            base = r64[:, None] * (HV * 128) + i_h * 128
            W = tl.load(w_ptr + base + kk[None, :], mask=m[:, None], other=0.0)
            Qp = tl.load(qp_ptr + base + kk[None, :], mask=m[:, None], other=0.0)
            Kt = tl.load(kt_ptr + r64[None, :] * (HV * 128) + i_h * 128 + kk[:, None], mask=m[None, :], other=0.0)
            U = tl.load(u_ptr + base + offs_v[None, :], mask=m[:, None], other=0.0)
            O0 = tl.load(o_base + r64[:, None] * (HV * 128), mask=m[:, None], other=0.0)
            g_end = tl.load(ge_ptr + (tl.minimum(eos, blk * 64 + 64) - 1) * HV + i_h)
            Sb = _low(S, DOT_FP32)
            R = U.to(tl.float32) - tl.dot(_low(W, DOT_FP32), Sb)  # [64, BV]; rows outside the piece: 0
            O = O0.to(tl.float32) + tl.dot(_low(Qp, DOT_FP32), Sb)
            tl.store(o_base + r64[:, None] * (HV * 128), O.to(tl.bfloat16), mask=m[:, None])
            S = tl.exp(g_end) * S + tl.dot(_low(Kt, DOT_FP32), _low(R, DOT_FP32))
        tl.store(s_ptrs, S)


# (BV, warps of the scan): the state rows per program trade parallelism (few sequences) for
# redundant loads of each piece's W, Q' and keys (many); the tuner measures each.
LAUNCH_CONFIGS = {"v16": dict(cfg=(16, 4)), "v64": dict(cfg=(64, 4))}


def config(num_seqs: int, num_v_heads: int) -> tuple[int, int]:
    """Default (BV, warps) of a direct call: enough programs to fill an H100's SMs twice."""
    return (16, 4) if num_seqs * num_v_heads * 2 < 264 else (64, 4)


def _chunked(q, k, v, gates, state, slots, init, cu_seqlens, out, scale, *, raw_gates, norm, has_state, cfg):
    """Both kernels. `gates` = (g, beta, None, None), or the contest's (a, b, A_log, dt_bias) with
    raw_gates; `slots` / `init`: the pool's slot and has_initial_state per sequence, or None (state n
    is sequence n's, read when has_state)."""
    T, HQK, _ = q.shape
    HV = v.shape[1]
    N = cu_seqlens.shape[0] - 1
    if N <= 0:
        return
    g, beta, A_log, dt_bias = gates
    g = g if g.stride(-1) == 1 else g.contiguous()
    beta = beta if beta.stride(-1) == 1 else beta.contiguous()
    dev = q.device
    a_tri = torch.empty(T, HV, CHUNK, dtype=torch.float32, device=dev)
    t_inv = torch.empty(T, HV, CHUNK, dtype=torch.bfloat16, device=dev)
    w, u, qp, kt = (torch.empty(T, HV, DIM, dtype=torch.bfloat16, device=dev) for _ in range(4))
    g_end = torch.empty(T, HV, dtype=torch.float32, device=dev)
    bv, warps = cfg or config(N, HV)
    dot_fp32 = dev.type != "cuda"
    gate_args = (g, beta, A_log if raw_gates else g, dt_bias if raw_gates else g, cu_seqlens)
    if T > 0:
        launch(_wy_kernel, (triton.cdiv(T, CHUNK), HV), q, k, v, *gate_args, a_tri, t_inv, w, u, qp, kt, g_end, out,
               scale, T, N, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
               g.stride(0), beta.stride(0), HV, HQK, norm, raw_gates, CU_BLOCK, dot_fp32, TRI_PRECISION,
               num_warps=8, num_stages=1)
    pooled = slots is not None
    ss = state.stride()
    launch(_scan_kernel, (N * HV * (DIM // bv),),
           w, u, qp, kt, g_end, state, slots if pooled else cu_seqlens, init if pooled else cu_seqlens, cu_seqlens,
           out, T, N, state.shape[0], ss[0], ss[1], ss[2],
           HV, bv, pooled, has_state, CU_BLOCK, dot_fp32, num_warps=warps, num_stages=2)


def _checked(q, k, v, out, state):
    for name, t in (("q", q), ("k", k), ("v", v), ("state", state)):
        if t.stride(-1) != 1:
            raise ValueError(f"triton_prefill_chunked: {name} needs a contiguous last dimension")
    if out.stride() != (out.shape[1] * DIM, DIM, 1):
        raise ValueError("triton_prefill_chunked: out must be contiguous")


def gdn_prefill_pool_chunked(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out,
                             scale, cfg: tuple[int, int] | None = None):
    """The engines' prefill (gdn_prefill_pool_*), chunked. Returns (out, state_pool)."""
    _checked(q, k, v, out, state_pool)
    _chunked(q, k, v, (g, beta, None, None), state_pool, state_indices, has_initial_state, cu_seqlens, out,
             _resolve_scale(scale, DIM), raw_gates=False, norm=True, has_state=True, cfg=cfg)
    return out, state_pool


def gdn_prefill_chunked(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale,
                        cfg: tuple[int, int] | None = None):
    """The contest's prefill (gdn_prefill_qk4_v8_d128_k_last), chunked: the final states are written
    into `state` in place (a new zero state when None). Returns (out, state)."""
    T, HV, N = q.shape[0], v.shape[1], cu_seqlens.shape[0] - 1
    given = state is not None
    if not given:
        state = torch.zeros(N, HV, DIM, DIM, dtype=torch.float32, device=q.device)
    out = torch.empty(T, HV, DIM, dtype=torch.bfloat16, device=q.device)
    _checked(q, k, v, out, state)
    _chunked(q, k, v, (a, b, A_log.contiguous(), dt_bias.contiguous()), state, None, None, cu_seqlens, out,
             _resolve_scale(scale, DIM), raw_gates=True, norm=False, has_state=given, cfg=cfg)
    return out, state


variant("gdn_prefill", "triton_prefill_chunked", backend="triton", archs=("sm90",), requires=("triton",),
        configs=LAUNCH_CONFIGS)(gdn_prefill_chunked)
for _hq, _hv in PACKED_HEADS.values():
    variant(pool_prefill_name(_hq, _hv), "triton_prefill_chunked", backend="triton", archs=("sm90",),
            requires=("triton",), configs=LAUNCH_CONFIGS, strided=True)(gdn_prefill_pool_chunked)
