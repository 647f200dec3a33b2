"""GDN prefill, chunked: two Triton kernels that do the delta rule 64 tokens at a time on tensor cores.

Definitions: gdn_prefill_pool_* (the engines' convention: q/k L2-normalised here, gates activated by
the engine, states in a pool of slots updated in place) and gdn_prefill_qk4_v8_d128_k_last (the
contest's: raw gates, a state per sequence).

Within a chunk of C tokens of one sequence, with G the cumulative log decay from the chunk start
(Gamma = exp(G)), S0 the state at the chunk start ([V, K], k-last) and the residual
r_t = beta_t (v_t - exp(g_t) S_{t-1} k_t) of each token, unrolling the recurrence gives

    R = U - W S0^T,  U = T diag(beta) V,  W = T diag(beta Gamma) K,
    T = (I + strictly_lower(diag(beta) (K K^T) * exp(G_i - G_j)))^-1,
    O = scale (diag(Gamma) Q S0^T + (Q K^T * exp(G_i - G_j), j <= i) R),
    S_C = exp(G_C) S0 + (R * exp(G_C - G))^T K.

T, W and U do not depend on the state, so they are computed for every chunk at once:
`_wy_kernel`, one program per (64-token block of the packed batch, value head). A block may hold the
tail of one sequence and the heads of others: every matrix is masked to pairs of tokens of the same
sequence and G restarts where a sequence starts, so each (block, sequence) piece is a chunk of its
own. T is inverted in 16-row blocks (each diagonal block as a finite series, then the off-diagonal
blocks from them, fp32), W and U go to bf16 scratch [T, HV, 128] and G to fp32 [T, HV]. The bf16
tensor-core products (fp32 accumulate) take q and k as given and scale by their inverse norms.

`_scan_kernel` then walks each sequence's pieces in order, one program per (sequence, value head,
BV rows of V) with its [BV, K] state block in registers: the four products above per piece. Its
time grows with the longest sequence's number of blocks (~64x fewer steps than a token-by-token
recurrence), its work with the tokens. Both kernels check cu_seqlens on the device (no host sync,
CUDA-graph safe): a malformed batch writes a zero output and no state; a sequence whose slot is
outside the pool writes zeros and touches no state.

Status (H100, 2026-11-26, benchmarks/gdn_chunked_profile.py, 8 value heads): correct on the CPU
(interpreter, both references), not competitive and not registered on main.
- First version (16-row blocks: 24 small products, forward substitution, then a series inverse;
  the scan recomputing norms, Q K^T and decays): WY ~20-25 us a program, scan ~6 us a 64-token
  step; 1x1024 tokens 133 us (recurrence 398, FlashInfer ~100), 22x2141 132 us (FlashInfer 62).
- This version (WY on whole 64 x 64 tiles with a block-doubling inverse in tf32x3, storing W, U,
  P = masked Q K^T and the row scales; the scan down to four products a step): the scan is 1.8x
  faster (1x1024: 56 us, 3.5 us a step; 255 registers, 20-84 spills) but the WY kernel regressed to
  ~100 us a program (255 registers, 434 spills: the 64 x 64 fp32 inverse and three [64, 128] tiles
  live at once), and compute-sanitizer still reports out-of-bounds shared-memory reads in the scan
  (35 at 1 token; the tf32 P R below removed the first one).
Next: split the WY kernel (K K^T and the inverse per 64 block with 8 warps, W/U products as a second
pass reading T from scratch, as fla does), find the remaining smem fault (likely another product
fed by a product: R^T K), then pipeline the scan's loads; FlashInfer's kernel needs ~0.6 us a chunk.

DOT_FP32: Triton's interpreter (TRITON_INTERPRET=1, the CPU tests) multiplies the raw bits in a
bf16 x bf16 tl.dot, so off CUDA the bf16 operands stay fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.definitions.gdn.spec import PACKED_HEADS, pool_prefill_name
from kdispatch.kernels.triton.gdn.decode_splitv import _resolve_scale
from kdispatch.kernels.triton.launch import launch
from kdispatch.registry import variant

CHUNK = 64
DIM = 128
CU_BLOCK = 256  # cu_seqlens entries examined per vector step


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
def _inv_unit_lower(N):
    """(I + N)^-1 for a strictly lower 64 x 64 N, by doubling blocks: with Y the block-diagonal part
    of I + N in b x b blocks (inverse Yi known) and C its b-blocks just below the diagonal inside each
    2b block, (Y + C)^-1 = Yi - Yi C Yi. Each level is an exact inverse (no growing series); fp32
    products in three tf32 passes."""
    r = tl.arange(0, 64)
    inv = (r[:, None] == r[None, :]).to(tl.float32)
    for lg in tl.static_range(0, 6):
        b = 1 << lg
        below = (r[:, None] // (2 * b) == r[None, :] // (2 * b)) & (r[:, None] // b != r[None, :] // b) \
            & (r[:, None] > r[None, :])
        c = tl.where(below, N, 0.0)
        inv = inv - tl.dot(inv, tl.dot(c, inv, input_precision="tf32x3"), input_precision="tf32x3")
    return inv


@triton.jit
def _wy_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, cu_ptr, w_ptr, u_ptr, p_ptr, sc_ptr, gc_ptr,
    T, N,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_bt,  # token and head strides (elements); gates: head stride 1
    HV: tl.constexpr, HQK: tl.constexpr, NORM: tl.constexpr, RAW_GATES: tl.constexpr,
    CU_BLOCK: tl.constexpr, DOT_FP32: tl.constexpr,
):
    i_blk = tl.program_id(0)
    i_h = tl.program_id(1)
    i_hk = i_h // (HV // HQK)
    rows = i_blk * 64 + tl.arange(0, 64)
    valid = rows < T
    r64 = rows.to(tl.int64)
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
    G = tl.sum(tl.where(same & (c[None, :] <= c[:, None]), g[None, :], 0.0), axis=1)  # from the piece start
    G_end = tl.sum(tl.where(same, g[None, :], 0.0), axis=1)  # at the piece's last row
    tl.store(gc_ptr + r64 * HV + i_h, G, mask=valid)

    cols = tl.arange(0, 128)[None, :]
    Q = tl.load(q_ptr + r64[:, None] * s_qt + i_hk * s_qh + cols, mask=valid[:, None], other=0.0)
    K = tl.load(k_ptr + r64[:, None] * s_kt + i_hk * s_kh + cols, mask=valid[:, None], other=0.0)
    V = tl.load(v_ptr + r64[:, None] * s_vt + i_h * s_vh + cols, mask=valid[:, None], other=0.0)
    rq = _rnorm(Q, NORM)
    rk = _rnorm(K, NORM)
    Q = _low(Q, DOT_FP32)
    K = _low(K, DOT_FP32)
    decay = tl.exp(tl.where(same, G[:, None] - G[None, :], 0.0))
    kk = tl.dot(K, tl.trans(K)) * rk[:, None] * rk[None, :]
    Nm = tl.where(same & (c[None, :] < c[:, None]), beta[:, None] * kk * decay, 0.0)
    Tinv = _inv_unit_lower(Nm)
    W = tl.dot(_low(Tinv * (beta * tl.exp(G) * rk)[None, :], DOT_FP32), K)  # T diag(beta Gamma / |k|) K
    U = tl.dot(_low(Tinv * beta[None, :], DOT_FP32), _low(V, DOT_FP32))  # T diag(beta) V
    qk = tl.dot(Q, tl.trans(K)) * rq[:, None] * rk[None, :]
    P = tl.where(same & (c[None, :] <= c[:, None]), qk * decay, 0.0)
    base = r64[:, None] * (HV * 128) + i_h * 128 + cols
    tl.store(w_ptr + base, W.to(tl.bfloat16), mask=valid[:, None])
    tl.store(u_ptr + base, U.to(tl.bfloat16), mask=valid[:, None])
    tl.store(p_ptr + r64[:, None] * (HV * 64) + i_h * 64 + c[None, :], P.to(tl.bfloat16), mask=valid[:, None])
    # per row: the scale of q S0^T (Gamma / |q|) and of the row's state update (exp(G_end - G) / |k|)
    tl.store(sc_ptr + (r64 * HV + i_h) * 2, rq * tl.exp(G), mask=valid)
    tl.store(sc_ptr + (r64 * HV + i_h) * 2 + 1, rk * tl.exp(G_end - G), mask=valid)


@triton.jit
def _scan_kernel(
    q_ptr, k_ptr, w_ptr, u_ptr, p_ptr, sc_ptr, gc_ptr, state_ptr, slot_ptr, init_ptr, cu_ptr, out_ptr,
    scale, T, N, num_slots,
    s_qt, s_qh, s_kt, s_kh, s_sn, s_sh, s_sv,  # q/k token and head strides; state slot, head, V row
    HV: tl.constexpr, HQK: tl.constexpr, BV: tl.constexpr,
    SLOTS: tl.constexpr,  # the pool convention: slot_ptr / init_ptr per sequence; else state n is sequence n's
    HAS_STATE: tl.constexpr,  # without SLOTS: whether the initial states are read (else zeros)
    CU_BLOCK: tl.constexpr, DOT_FP32: tl.constexpr,
):
    NVB: tl.constexpr = 128 // BV
    pid = tl.program_id(0)
    i_vb = pid % NVB
    i_h = (pid // NVB) % HV
    i_n = (pid // NVB // HV).to(tl.int64)
    i_hk = i_h // (HV // HQK)
    offs_v = i_vb * BV + tl.arange(0, BV)
    cols = tl.arange(0, 128)
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
        s_ptrs = state_ptr + slot * s_sn + i_h * s_sh + offs_v[:, None] * s_sv + cols[None, :]
        if SLOTS:
            if tl.load(init_ptr + i_n).to(tl.int32) != 0:  # a fresh sequence reads no state
                S = tl.load(s_ptrs)  # [BV, K] fp32
            else:
                S = tl.zeros([BV, 128], dtype=tl.float32)
        elif HAS_STATE:
            S = tl.load(s_ptrs)
        else:
            S = tl.zeros([BV, 128], dtype=tl.float32)
        c = tl.arange(0, 64)
        for blk in range(bos // 64, (eos + 63) // 64):
            rows = blk * 64 + c
            m = (rows >= bos) & (rows < eos)
            r64 = rows.to(tl.int64)
            wu = r64[:, None] * (HV * 128) + i_h * 128
            W = tl.load(w_ptr + wu + cols[None, :], mask=m[:, None], other=0.0)
            U = tl.load(u_ptr + wu + offs_v[None, :], mask=m[:, None], other=0.0)
            Q = tl.load(q_ptr + r64[:, None] * s_qt + i_hk * s_qh + cols[None, :], mask=m[:, None], other=0.0)
            K = tl.load(k_ptr + r64[:, None] * s_kt + i_hk * s_kh + cols[None, :], mask=m[:, None], other=0.0)
            P = tl.load(p_ptr + r64[:, None] * (HV * 64) + i_h * 64 + c[None, :], mask=m[:, None] & m[None, :],
                        other=0.0)
            sq = tl.load(sc_ptr + (r64 * HV + i_h) * 2, mask=m, other=0.0)
            sk = tl.load(sc_ptr + (r64 * HV + i_h) * 2 + 1, mask=m, other=0.0)
            last = tl.minimum(eos, blk * 64 + 64) - 1
            g_end = tl.load(gc_ptr + last * HV + i_h)
            St = tl.trans(_low(S, DOT_FP32))  # [K, BV]
            R = U.to(tl.float32) - tl.dot(_low(W, DOT_FP32), St)  # [64, BV]
            # P R in tf32: Triton 3.6 reads shared memory out of bounds for a bf16 product whose operand
            # comes from another product (compute-sanitizer, H100)
            O = tl.dot(_low(Q, DOT_FP32), St) * sq[:, None] + tl.dot(P.to(tl.float32), R)
            tl.store(o_base + r64[:, None] * (HV * 128), (scale * O).to(tl.bfloat16), mask=m[:, None])
            S = tl.exp(g_end) * S + tl.dot(tl.trans(_low(R * sk[:, None], DOT_FP32)), _low(K, DOT_FP32))
        tl.store(s_ptrs, S)


# (BV, warps of the scan): the state rows per program trade parallelism (few sequences) for
# redundant q/k/W loads (many); the tuner measures each.
LAUNCH_CONFIGS = {"v32": dict(cfg=(32, 4)), "v64": dict(cfg=(64, 4)), "v64w8": dict(cfg=(64, 8))}


def config(num_seqs: int, num_v_heads: int) -> tuple[int, int]:
    """Default (BV, warps) of a direct call: enough programs to fill an H100's SMs twice."""
    return (32, 4) if num_seqs * num_v_heads * 2 < 264 else (64, 4)


def _chunked(q, k, v, gates, state, slots, init, cu_seqlens, out, scale, *, raw_gates, norm, has_state, cfg):
    """Both launches. `gates` = (g, beta, None, None), or the contest's (a, b, A_log, dt_bias) with
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
    w = torch.empty(T, HV, DIM, dtype=torch.bfloat16, device=q.device)
    u = torch.empty_like(w)
    p = torch.empty(T, HV, CHUNK, dtype=torch.bfloat16, device=q.device)
    sc = torch.empty(T, HV, 2, dtype=torch.float32, device=q.device)
    gc = torch.empty(T, HV, dtype=torch.float32, device=q.device)
    bv, warps = cfg or config(N, HV)
    dot_fp32 = q.device.type != "cuda"
    if T > 0:
        launch(_wy_kernel, (triton.cdiv(T, CHUNK), HV),
               q, k, v, g, beta, A_log if raw_gates else g, dt_bias if raw_gates else g, cu_seqlens, w, u, p, sc, gc,
               T, N, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0),
               beta.stride(0), HV, HQK, norm, raw_gates, CU_BLOCK, dot_fp32, num_warps=4, num_stages=1)
    pooled = slots is not None
    ss = state.stride()
    launch(_scan_kernel, (N * HV * (DIM // bv),),
           q, k, w, u, p, sc, gc, state, slots if pooled else cu_seqlens, init if pooled else cu_seqlens, cu_seqlens,
           out, scale, T, N, state.shape[0], q.stride(0), q.stride(1), k.stride(0), k.stride(1), ss[0], ss[1], ss[2],
           HV, HQK, bv, pooled, has_state, CU_BLOCK, dot_fp32, num_warps=warps, num_stages=2)


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
