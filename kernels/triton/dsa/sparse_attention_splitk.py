"""DSA sparse MLA attention, split over the selected keys (split-K, decode-like): Triton.

Definition: dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64.

    q_nope          [T, H, DC]     bf16   (H = 16 heads, DC = 512 compressed-KV width)
    q_pe            [T, H, DP]     bf16   (DP = 64 rope width)
    ckv_cache       [P, PS, DC]    bf16   (PS = 64 tokens per page; keys' first 512 dims AND values)
    kpe_cache       [P, PS, DP]    bf16
    sparse_indices  [T, TOPK]      int32  global token ids page * PS + slot, -1 = unused (TOPK = 2048)
    sm_scale        python float
    -> output [T, H, DC] bf16, lse [T, H] fp32 (base-2 log-sum-exp of the scaled logits;
       a token without any valid index: output zeros, lse -inf)

Per token t, head h, with the selected rows j = sparse_indices[t, :] (valid ones only):

    s[h, j]   = sm_scale * log2(e) * (q_nope[t, h] . ckv[j] + q_pe[t, h] . kpe[j])   (base-2 logits)
    out[t, h] = sum_j 2^(s[h, j]) ckv[j] / sum_j 2^(s[h, j]);   lse[t, h] = log2 sum_j 2^(s[h, j])

T is small in the contest (1..8), so parallelism comes from the keys, not the tokens:

1. `_dsa_splitk_partial_kernel`, grid (T, NSPLIT). Program (t, s) owns the index slots
   [s * SPLIT_LEN, (s + 1) * SPLIT_LEN) of row t (SPLIT_LEN = TOPK / NSPLIT) and walks them BLOCK_N at
   a time: it gathers the BLOCK_N rows of ckv [BLOCK_N, 512] and kpe [BLOCK_N, 64] straight from the
   paged cache through the indices (no copy of the cache; -1 slots are masked, never loaded), computes
   the logits of all 16 heads with two tl.dot (q_nope [16, 512] x ckv^T, q_pe [16, 64] x kpe^T), and
   keeps a base-2 online softmax (running max m, running sum l) and an fp32 accumulator [16, 512]
   (the gathered ckv tile is reused as V). It writes the split's normalized output acc / l and its
   lse m + log2(l) (-inf for a split without a valid index) to fp32 workspaces.
2. `_dsa_splitk_merge_kernel`, grid (T, H, DC / 128): lse-weighted merge of the NSPLIT partials:
   M = max_s lse_s, w_s = 2^(lse_s - M), out = sum_s w_s out_s / sum_s w_s, lse = M + log2(sum_s w_s),
   written as bf16 output and fp32 lse; a row whose splits are all empty gets zeros and -inf.

No host sync anywhere (no .item(), workspaces sized from shapes only): safe under CUDA-graph capture.

DOT_FP32: Triton 3.9's interpreter (TRITON_INTERPRET=1, the CPU tests) computes bf16 x bf16 tl.dot
wrongly (it multiplies the raw bits), so the operands are cast to fp32 before every tl.dot when the
flag is set. The wrapper sets it only when the tensors are not on a CUDA device; on the GPU the
operands stay bf16 (tensor cores, fp32 accumulate); tests/gpu/test_triton_dsa_moe.py checks that
path on contest workloads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.kernels.triton.launch import launch
from kdispatch.registry import variant

LOG2E = 1.4426950408889634


@triton.jit
def _dsa_splitk_partial_kernel(
    qn_ptr, qp_ptr, ckv_ptr, kpe_ptr, idx_ptr, ws_o_ptr, ws_lse_ptr,
    scale_log2,  # sm_scale * log2(e)
    n_cache_tokens,  # P * PS: indices outside [0, n_cache_tokens) are treated as unused
    s_qn_t, s_qn_h,  # q_nope strides of token and head axes (last axis contiguous)
    s_qp_t, s_qp_h,
    s_idx_t,  # sparse_indices stride of the token axis (last axis contiguous)
    H: tl.constexpr, DC: tl.constexpr, DP: tl.constexpr,
    SPLIT_LEN: tl.constexpr, BLOCK_N: tl.constexpr, NSPLIT: tl.constexpr, DOT_FP32: tl.constexpr,
):
    i_t = tl.program_id(0).to(tl.int64)
    i_s = tl.program_id(1)

    offs_h = tl.arange(0, H)
    offs_dc = tl.arange(0, DC)
    offs_dp = tl.arange(0, DP)
    offs_n = tl.arange(0, BLOCK_N)

    qn = tl.load(qn_ptr + i_t * s_qn_t + offs_h[:, None] * s_qn_h + offs_dc[None, :])  # [H, DC]
    qp = tl.load(qp_ptr + i_t * s_qp_t + offs_h[:, None] * s_qp_h + offs_dp[None, :])  # [H, DP]
    if DOT_FP32:
        qn = qn.to(tl.float32)
        qp = qp.to(tl.float32)

    m_i = tl.full([H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([H], dtype=tl.float32)
    acc = tl.zeros([H, DC], dtype=tl.float32)

    start = i_s * SPLIT_LEN
    for n0 in range(0, SPLIT_LEN, BLOCK_N):
        idx = tl.load(idx_ptr + i_t * s_idx_t + start + n0 + offs_n)  # [BLOCK_N] int32
        valid = (idx >= 0) & (idx < n_cache_tokens)
        row = tl.where(valid, idx, 0).to(tl.int64)
        # Gather the selected cache rows (ckv is [P * PS, DC] row-major, kpe [P * PS, DP]).
        kv = tl.load(ckv_ptr + row[:, None] * DC + offs_dc[None, :], mask=valid[:, None], other=0.0)
        kp = tl.load(kpe_ptr + row[:, None] * DP + offs_dp[None, :], mask=valid[:, None], other=0.0)
        if DOT_FP32:  # interpreter workaround, see the module docstring
            kv = kv.to(tl.float32)
            kp = kp.to(tl.float32)

        s = tl.dot(qn, tl.trans(kv)) + tl.dot(qp, tl.trans(kp))  # [H, BLOCK_N] fp32
        s = tl.where(valid[None, :], s * scale_log2, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: avoid -inf - -inf
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])  # exactly 0 at masked slots
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)
        m_i = m_new

    has = l_i > 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))

    ws_row = i_t * NSPLIT + i_s  # workspace [T, NSPLIT, H, DC] and [T, NSPLIT, H], contiguous
    tl.store(ws_o_ptr + ws_row * (H * DC) + offs_h[:, None] * DC + offs_dc[None, :], out)
    tl.store(ws_lse_ptr + ws_row * H + offs_h, lse)


@triton.jit
def _dsa_splitk_merge_kernel(
    ws_o_ptr, ws_lse_ptr, out_ptr, lse_ptr,
    s_o_t, s_o_h,  # output strides of token and head axes (last axis contiguous)
    H: tl.constexpr, DC: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:  # launched as a programmatic dependent of the partial kernel: wait for its partials
        tl.extra.cuda.gdc_wait()
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    i_d = tl.program_id(2)
    offs_s = tl.arange(0, NSPLIT)
    offs_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)

    lse_s = tl.load(ws_lse_ptr + (i_t * NSPLIT + offs_s) * H + i_h)  # [NSPLIT]
    m = tl.max(lse_s, axis=0)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse_s - m_use)  # 0 for empty splits
    w_sum = tl.sum(w, axis=0)
    o_s = tl.load(ws_o_ptr + ((i_t * NSPLIT + offs_s[:, None]) * H + i_h) * DC + offs_d[None, :])
    has = w_sum > 0.0
    o = tl.sum(o_s * w[:, None], axis=0) / tl.where(has, w_sum, 1.0)  # [BLOCK_D]; zeros if no valid key
    tl.store(out_ptr + i_t * s_o_t + i_h * s_o_h + offs_d, o.to(out_ptr.dtype.element_ty))
    if i_d == 0:
        lse = tl.where(has, m_use + tl.log2(tl.where(has, w_sum, 1.0)), float("-inf"))
        tl.store(lse_ptr + i_t * H + i_h, lse)


# Launch heuristic, from `python benchmarks/dsa.py --sweep` (H100, 2026-11-22, contest workloads):
# at 1-2 query tokens 64 splits of one 32-key block each (64-128 programs) were fastest
# (10.2-10.7 us before the merge was split over DC); at 6-8 tokens 16 splits of 64-key blocks
# (96-128 programs) or 32 splits of 32 keys, within 1% of each other. 4 warps beat 8 throughout.
# Past the contest's 8 tokens the splits halve to keep NSPLIT x tokens <= 256: the fp32 workspace
# (32 KiB per split and token) stays within 8 MiB at any token count (one split from 129 tokens).
def splitk_config(num_tokens: int, topk: int = 2048) -> tuple[int, int, int]:
    """(BLOCK_N, NSPLIT, num_warps) for `num_tokens` query tokens."""
    if num_tokens <= 4:
        return 32, min(64, topk // 32), 4
    nsplit = min(16, topk // 64)
    while nsplit > 1 and nsplit * num_tokens > 256:
        nsplit //= 2
    return 64, nsplit, 4


def _lastdim_contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def new_outputs(q_nope: torch.Tensor, sm_scale) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Empty output [T, H, DC] bf16 and lse [T, H] fp32 for q_nope [T, H, DC], and sm_scale as a
    float (kdispatch passes a float; a tensor costs a device sync)."""
    T, H, DC = q_nope.shape
    output = torch.empty(T, H, DC, dtype=torch.bfloat16, device=q_nope.device)
    lse = torch.empty(T, H, dtype=torch.float32, device=q_nope.device)
    return output, lse, float(sm_scale)


def split_workspace(output: torch.Tensor, nsplit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partials [T, nsplit, H, DC] and their lse [T, nsplit, H] for `output` [T, H, DC]."""
    T, H, DC = output.shape
    return (torch.empty(T, nsplit, H, DC, dtype=torch.float32, device=output.device),
            torch.empty(T, nsplit, H, dtype=torch.float32, device=output.device))


def dsa_sparse_attention_splitk(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, *,
                                BLOCK_N: int | None = None, NSPLIT: int | None = None,
                                num_warps: int | None = None, dot_fp32: bool | None = None):
    """Sparse MLA attention; returns (output [T, H, 512] bf16, lse [T, H] fp32 base 2).

    BLOCK_N / NSPLIT / num_warps override `splitk_config`; NSPLIT and BLOCK_N must be powers of two
    with NSPLIT * BLOCK_N dividing TOPK. dot_fp32 (default: True off CUDA) casts tl.dot operands to
    fp32 (needed by the Triton interpreter)."""
    T, H, DC = q_nope.shape
    DP = q_pe.shape[-1]
    P, PS, _ = ckv_cache.shape
    TOPK = sparse_indices.shape[-1]
    dbn, dns, dnw = splitk_config(T, TOPK)
    BLOCK_N = BLOCK_N or dbn
    NSPLIT = NSPLIT or dns
    num_warps = num_warps or dnw
    assert TOPK % (NSPLIT * BLOCK_N) == 0, "NSPLIT * BLOCK_N must divide topk"
    assert NSPLIT & (NSPLIT - 1) == 0 and BLOCK_N & (BLOCK_N - 1) == 0
    if dot_fp32 is None:
        dot_fp32 = q_nope.device.type != "cuda"
    output, lse, sm_scale = new_outputs(q_nope, sm_scale)
    if T == 0:
        return output, lse
    q_nope, q_pe, sparse_indices = _lastdim_contig(q_nope), _lastdim_contig(q_pe), _lastdim_contig(sparse_indices)
    ckv, kpe = ckv_cache.contiguous(), kpe_cache.contiguous()  # no-op for a pool (always contiguous)

    ws_o, ws_lse = split_workspace(output, NSPLIT)
    launch(_dsa_splitk_partial_kernel, (T, NSPLIT),
           q_nope, q_pe, ckv, kpe, sparse_indices, ws_o, ws_lse, float(sm_scale) * LOG2E, P * PS,
           q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), sparse_indices.stride(0),
           H, DC, DP, TOPK // NSPLIT, BLOCK_N, NSPLIT, bool(dot_fp32), num_warps=num_warps)
    merge_splits(ws_o, ws_lse, output, lse)
    return output, lse


def merge_splits(ws_o: torch.Tensor, ws_lse: torch.Tensor, output: torch.Tensor, lse: torch.Tensor, *,
                 pdl: bool = False) -> None:
    """Combine split partials ws_o [T, NSPLIT, H, DC] fp32 (normalized, finite) and ws_lse
    [T, NSPLIT, H] (base 2, -inf for an empty split) into output [T, H, DC] (last axis contiguous)
    and lse [T, H]. Also the merge of the CUDA split-K variant (kernels/cuda/dsa). `pdl`: launch as
    a programmatic dependent of the kernel just launched, which writes the partials (CUDA only)."""
    T, nsplit, heads, dc = ws_o.shape
    block_d = min(dc, 128)  # the merge is split over DC too: T * H * DC / 128 programs
    grid = (T, heads, dc // block_d)
    if pdl:  # a launch option launch() does not pass: the JIT call
        _dsa_splitk_merge_kernel[grid](ws_o, ws_lse, output, lse, output.stride(0), output.stride(1),
                                       H=heads, DC=dc, NSPLIT=nsplit, BLOCK_D=block_d, PDL=True, num_warps=4,
                                       launch_pdl=True)
        return
    launch(_dsa_splitk_merge_kernel, grid, ws_o, ws_lse, output, lse, output.stride(0), output.stride(1),
           heads, dc, nsplit, block_d, False)


# (BLOCK_N, NSPLIT) pairs the tuner measures as `triton_splitk.b32s64`, ...; `splitk_config` is the
# default of a direct call.
CONFIGS = ((32, 64), (64, 16), (64, 4), (64, 1))
MAX_WORKSPACE_PROGRAMS = 1024  # NSPLIT x tokens of a registered configuration: at most 32 MiB of partials


def _fits_workspace(features: dict, kwargs: dict) -> str | None:
    if kwargs["NSPLIT"] * features["num_tokens"] > MAX_WORKSPACE_PROGRAMS and kwargs["NSPLIT"] > 1:
        return f"{kwargs['NSPLIT']} splits x {features['num_tokens']} tokens: workspace above 32 MiB"
    return None


@variant("dsa_sparse_attention", "triton_splitk", backend="triton", archs=("sm90",), requires=("triton",),
         configs={f"b{bn}s{ns}": dict(BLOCK_N=bn, NSPLIT=ns) for bn, ns in CONFIGS}, supports=_fits_workspace)
def dsa_sparse_attention_triton_splitk(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, *,
                                       BLOCK_N: int, NSPLIT: int):
    return dsa_sparse_attention_splitk(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale,
                                       BLOCK_N=BLOCK_N, NSPLIT=NSPLIT)
