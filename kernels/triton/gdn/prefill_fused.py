"""GDN prefill, chunked and fused: one Triton kernel that walks each sequence C tokens at a time on
tensor cores, the state in registers, nothing through scratch.

Definitions: gdn_prefill_pool_* (the engines' convention) and gdn_prefill_qk4_v8_d128_k_last (the
contest's), as prefill_chunked.py, whose block algebra this is, rearranged so that nothing but the
state crosses a chunk: within a chunk of C tokens of one sequence (chunks start at the sequence's
first token), with G the inclusive cumulative log decay from the chunk start, Gamma = exp(G) and
S0^T [K, BV] the state rows this program holds,

    X = diag(beta) (V - diag(Gamma) K S0^T)                       the residuals' right-hand side
    R = T X,  T = (I + strictly_lower(diag(beta) (K K^T) * exp(G_i - G_j)))^-1
    O = scale (diag(Gamma) Q S0^T + (Q K^T * exp(G_i - G_j))_{j <= i} R)
    S^T = exp(G_end) S0^T + (diag(exp(G_end - G)) K)^T R.

T is built in registers by doubling: A is nilpotent (A^C = 0), so (I + A)^-1 = prod_m (I + B^(2^m)),
B = -A, over 2^m < C: log2(C) - 1 squarings and as many products of C x C tiles. One program per
(sequence, value head, BV rows of V); the products with K, Q and T repeat in each of a head's
128 / BV programs, the price of keeping every intermediate on chip. Where prefill_chunked.py's block
kernel writes and re-reads five [T, HV, 128] tensors, this kernel reads q/k/v and the state once
and writes the output and the state once, so it wins where the sequences are short enough for their
chunks to run one after another; long sequences at few heads leave SMs idle (their chunks are
serial here, parallel in prefill_chunked.py's block kernel), which the tuner's measurements decide.

Device-side checks as the other prefill kernels (no host sync, CUDA-graph safe): a malformed batch
writes a zero output and no state; a sequence whose slot is outside the pool writes zeros and
touches no state. DOT_FP32: under the interpreter the bf16 operands stay fp32 (prefill_chunked.py).

Where it stands (H100, benchmarks/results/gdn-fused-grid-H100.txt, graph replays, 2026-11-26): at 32
value heads, 16 sequences x 1,024 tokens 74 us (the two-kernel chunked call 141, the recurrence 185),
64 x 4,096 243 us (525, 568); one sequence of 2,048 tokens 305 us (chunked 252: its chunks run in
parallel there). A 16-token step of one program takes ~2 us alone and ~9 us with four programs an SM.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.kernels.triton.gdn.decode_splitv import _resolve_scale
from kdispatch.kernels.triton.gdn.prefill_chunked import CU_BLOCK, DIM, TRI_PRECISION, _batch_ok, _low
from kdispatch.kernels.triton.launch import launch
from kdispatch.registry import variant


@triton.jit
def _unit_lower_inverse(A, C: tl.constexpr, LOG_C: tl.constexpr, PREC: tl.constexpr):
    """(I + A)^-1 of a strictly lower C x C fp32 tile (C = 2^LOG_C), in registers: the product of
    (I + B^(2^m))."""
    i = tl.arange(0, C)
    eye = (i[:, None] == i[None, :]).to(tl.float32)
    B = -A
    Tinv = eye + B
    for _ in tl.static_range(1, LOG_C):  # B^2, B^4, ..., B^(C/2)
        B = tl.dot(B, B, input_precision=PREC)
        Tinv = Tinv + tl.dot(Tinv, B, input_precision=PREC)
    return Tinv


@triton.jit
def _gate_values(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, rows, valid, i_h, s_gt, s_bt, RAW_GATES: tl.constexpr):
    """Log decay g and write strength beta of the given rows (0 outside `valid`): as given, or from the
    contest's raw gates (g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b))."""
    if RAW_GATES:
        x = tl.load(g_ptr + rows * s_gt + i_h, mask=valid, other=0.0).to(tl.float32) + tl.load(dt_bias_ptr + i_h)
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        g = -tl.exp(tl.load(A_log_ptr + i_h)) * softplus
        beta = 1.0 / (1.0 + tl.exp(-tl.load(beta_ptr + rows * s_bt + i_h, mask=valid, other=0.0).to(tl.float32)))
    else:
        g = tl.load(g_ptr + rows * s_gt + i_h, mask=valid, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + rows * s_bt + i_h, mask=valid, other=0.0).to(tl.float32)
    return tl.where(valid, g, 0.0), tl.where(valid, beta, 0.0)


@triton.jit
def _chunk_loads(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, r64, m, i_h, i_hk, offs_v,
                 s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_bt, RAW_GATES: tl.constexpr):
    """k, q, v rows (as stored) and g, beta of the chunk's rows r64 (zeros outside m)."""
    kk = tl.arange(0, 128)
    K = tl.load(k_ptr + r64[:, None] * s_kt + i_hk * s_kh + kk[None, :], mask=m[:, None], other=0.0)
    Q = tl.load(q_ptr + r64[:, None] * s_qt + i_hk * s_qh + kk[None, :], mask=m[:, None], other=0.0)
    V = tl.load(v_ptr + r64[:, None] * s_vt + i_h * s_vh + offs_v[None, :], mask=m[:, None], other=0.0)
    g, beta = _gate_values(g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, r64, m, i_h, s_gt, s_bt, RAW_GATES)
    return K, Q, V, g, beta


@triton.jit
def _normalised(x, NORM: tl.constexpr):
    """Rows of x in fp32, L2-normalised as the reference (x / sqrt(sum x^2 + 1e-6)) with NORM."""
    xf = x.to(tl.float32)
    if NORM:
        xf = xf / tl.sqrt(tl.sum(xf * xf, axis=1) + 1e-6)[:, None]
    return xf


@triton.jit
def _fused_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slot_ptr, init_ptr, cu_ptr, out_ptr,
    scale, T, N, num_slots,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_bt,  # token and head strides (elements); gates: head stride 1
    s_sn, s_sh, s_sv,  # state slot, head, V row strides
    HV: tl.constexpr, HQK: tl.constexpr, BV: tl.constexpr, C: tl.constexpr, LOG_C: tl.constexpr,
    NORM: tl.constexpr, RAW_GATES: tl.constexpr,
    SLOTS: tl.constexpr,  # the pool convention: slot_ptr / init_ptr per sequence; else state n is sequence n's
    HAS_STATE: tl.constexpr,  # without SLOTS: whether the initial states are read (else zeros)
    CU_BLOCK: tl.constexpr, DOT_FP32: tl.constexpr, PREC: tl.constexpr,
):
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
        lower = c[None, :] < c[:, None]
        causal = c[None, :] <= c[:, None]
        nxt = bos + c  # each chunk's loads are issued before the previous chunk's products (DRAM latency)
        Kn, Qn, Vn, gn, bn = _chunk_loads(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, nxt.to(tl.int64),
                                          nxt < eos, i_h, i_hk, offs_v, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_bt,
                                          RAW_GATES)
        for t0 in range(bos, eos, C):
            rows = t0 + c
            m = rows < eos
            r64 = rows.to(tl.int64)
            K_raw, Q_raw, V, g, beta = Kn, Qn, Vn, gn, bn
            Kn, Qn, Vn, gn, bn = _chunk_loads(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, A_log_ptr, dt_bias_ptr, r64 + C,
                                              rows + C < eos, i_h, i_hk, offs_v, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh,
                                              s_gt, s_bt, RAW_GATES)
            K = _normalised(K_raw, NORM)
            Q = _normalised(Q_raw, NORM)
            V = V.to(tl.float32)
            G = tl.cumsum(g, axis=0)
            G_end = tl.sum(g, axis=0)
            decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], 0.0))
            Kl = _low(K, DOT_FP32)
            Ql = _low(Q, DOT_FP32)
            Sl = _low(S, DOT_FP32)
            A = tl.where(lower, tl.dot(Kl, tl.trans(Kl)) * beta[:, None] * decay, 0.0)
            Tinv = _unit_lower_inverse(A, C, LOG_C, PREC)
            gam = tl.exp(G)
            X = beta[:, None] * (V - gam[:, None] * tl.dot(Kl, Sl))
            R = _low(tl.dot(_low(Tinv, DOT_FP32), _low(X, DOT_FP32)), DOT_FP32)
            P = tl.where(causal, tl.dot(Ql, tl.trans(Kl)) * decay, 0.0)
            O = scale * (gam[:, None] * tl.dot(Ql, Sl) + tl.dot(_low(P, DOT_FP32), R))
            tl.store(o_base + r64[:, None] * (HV * 128), O.to(tl.bfloat16), mask=m[:, None])
            Kt = _low(K * tl.exp(G_end - G)[:, None], DOT_FP32)
            S = tl.exp(G_end) * S + tl.dot(tl.trans(Kt), R)
        tl.store(s_ptrs, S)


# (C tokens a step, BV state rows a program, warps). H100 (benchmarks/gdn_fused_grid.py, 2026-11-26):
# 16-token chunks were fastest on every shape measured (32 and 64 do fewer, longer serial steps; with
# the prefetch their registers cost more than it saves); 64 rows a program from ~128 (sequence, head)
# pairs, 32 below (twice the programs), 128 at 8 warps no faster than 64 at 4. C = 64 with BV = 32 at
# 4 warps computed wrong results there (Triton 3.6): not a configuration. The tuner measures each.
LAUNCH_CONFIGS = {"c16v32": dict(cfg=(16, 32, 4)), "c16v64": dict(cfg=(16, 64, 4))}


def config(num_seqs: int, num_v_heads: int) -> tuple[int, int, int]:
    """Default (C, BV, warps) of a direct call."""
    return (16, 32, 4) if num_seqs * num_v_heads <= 64 else (16, 64, 4)


def _fused(q, k, v, gates, state, slots, init, cu_seqlens, out, scale, *, raw_gates, norm, has_state, cfg):
    """One launch. `gates` = (g, beta, None, None), or the contest's (a, b, A_log, dt_bias) with raw_gates;
    `slots` / `init`: the pool's slot and has_initial_state per sequence, or None (state n is sequence n's,
    read when has_state)."""
    T, HQK, _ = q.shape
    HV = v.shape[1]
    N = cu_seqlens.shape[0] - 1
    if N <= 0:
        return
    g, beta, A_log, dt_bias = gates
    g = g if g.stride(-1) == 1 else g.contiguous()
    beta = beta if beta.stride(-1) == 1 else beta.contiguous()
    chunk, bv, warps = cfg or config(N, HV)
    if chunk not in (16, 32):  # 64: slower everywhere measured, and wrong at BV = 32 (see LAUNCH_CONFIGS)
        raise ValueError(f"triton_prefill_fused: chunk length {chunk} is not 16 or 32")
    pooled = slots is not None
    ss = state.stride()
    launch(_fused_kernel, (N * HV * (DIM // bv),),
           q, k, v, g, beta, A_log if raw_gates else g, dt_bias if raw_gates else g, state,
           slots if pooled else cu_seqlens, init if pooled else cu_seqlens, cu_seqlens, out,
           scale, T, N, state.shape[0], q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
           g.stride(0), beta.stride(0), ss[0], ss[1], ss[2],
           HV, HQK, bv, chunk, chunk.bit_length() - 1, norm, raw_gates, pooled, has_state, CU_BLOCK, q.device.type != "cuda", TRI_PRECISION,
           num_warps=warps, num_stages=2)


def _checked(q, k, v, out, state):
    for name, t in (("q", q), ("k", k), ("v", v), ("state", state)):
        if t.stride(-1) != 1:
            raise ValueError(f"triton_prefill_fused: {name} needs a contiguous last dimension")
    if out.stride() != (out.shape[1] * DIM, DIM, 1):
        raise ValueError("triton_prefill_fused: out must be contiguous")


def gdn_prefill_pool_fused(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out,
                           scale, cfg: tuple[int, int, int] | None = None):
    """The engines' prefill (gdn_prefill_pool_*), fused. Returns (out, state_pool)."""
    _checked(q, k, v, out, state_pool)
    _fused(q, k, v, (g, beta, None, None), state_pool, state_indices, has_initial_state, cu_seqlens, out,
           _resolve_scale(scale, DIM), raw_gates=False, norm=True, has_state=True, cfg=cfg)
    return out, state_pool


def gdn_prefill_fused(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, cfg: tuple[int, int, int] | None = None):
    """The contest's prefill (gdn_prefill_qk4_v8_d128_k_last), fused: the final states are written into
    `state` in place (a new zero state when None). Returns (out, state)."""
    T, HV, N = q.shape[0], v.shape[1], cu_seqlens.shape[0] - 1
    given = state is not None
    if not given:
        state = torch.zeros(N, HV, DIM, DIM, dtype=torch.float32, device=q.device)
    out = torch.empty(T, HV, DIM, dtype=torch.bfloat16, device=q.device)
    _checked(q, k, v, out, state)
    _fused(q, k, v, (a, b, A_log.contiguous(), dt_bias.contiguous()), state, None, None, cu_seqlens, out,
           _resolve_scale(scale, DIM), raw_gates=True, norm=False, has_state=given, cfg=cfg)
    return out, state


variant("gdn_prefill", "triton_prefill_fused", backend="triton", archs=("sm90",), requires=("triton",),
        configs=LAUNCH_CONFIGS)(gdn_prefill_fused)
for _hq, _hv in PACKED_HEADS.values():
    variant(pool_prefill_name(_hq, _hv), "triton_prefill_fused", backend="triton", archs=("sm90",),
            requires=("triton",), configs=LAUNCH_CONFIGS, strided=True)(gdn_prefill_pool_fused)
