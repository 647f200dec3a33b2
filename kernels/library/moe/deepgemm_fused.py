"""DeepGEMM's grouped FP8 GEMMs with the glue between them fused into Triton kernels: the moe_fp8
prefill path on sm_90 that the MoE issue asks for (DeepGEMM's GEMM speed, the permutation and combine
on the device).

`deepgemm_contiguous` (deepgemm.py) runs the same two DeepGEMM GEMMs between torch ops. Profiled at
16,384 tokens (H100, 2026-11-28, benchmarks/moe_profile.py) its GEMMs took 1,317 us of a 5,220 us
call, against 3,493 us for the Triton grouped variants' own two GEMMs; the rest was glue: the combine's
index_add_ 898 us, the SiLU-and-mul and re-quantisation about 2 ms in a dozen elementwise passes.
Here, around the same GEMMs:

1. routing and the expert-sorted layout: the Triton grouped variants' `_fused_route_layout` with
   128-row blocks (DeepGEMM's M alignment on sm_90): each expert's run of rows, then blocks past the
   last expert (their `block_expert` is the local expert count).
2. `_gather_rows_kernel`: each row's token's FP8 activations and their scales ([rows, H / 128], the
   layout DeepGEMM converts itself), the row's expert (m_indices, -1 for padding rows, whose
   activations are zeros), and each routed pair's row (for the combine).
3. GEMM1 (bf16 [rows, 2 I]), then `_silu_mul_quant_kernel`: SiLU of the second half times the first,
   FP8 with one scale per row and 128 columns (SGLang's quantisation of the down projection input).
4. GEMM2 (bf16 [rows, H]), then `_combine_kernel`: each token's output is the weighted sum of its
   routed rows, in fp32, written as bf16: no fp32 buffer, no atomics, a fixed summation order.

Two sizings of the rows, two variants:
- `deepgemm_fused`: the live row blocks counted on the host (a sync, as in deepgemm_contiguous: eager only, a
  capture raises; SGLang's DeepGEMM runner sizes its rows from host-side counts too);
- `deepgemm_fused_bound`: every buffer sized for the most rows the routing can place (T x 8 plus each expert's
  padding), no sync, capturable. The GEMMs take DeepGEMM's psum layout (`use_psum_layout`: per expert
  the end row of its run, each run starting at the previous end rounded up to 128, which is this
  layout), so they visit the routed blocks only, not the bound's; `_psum_kernel` finds the ends on
  the device. The glue kernels return at once past the last expert. The buffers hold ~0.26 GB per
  1,000 tokens (8.5 GB at 32,768), kept by a CUDA graph's memory pool.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.kernels.library.moe.deepgemm import BLOCK_M
from kdispatch.kernels.triton.launches import Launches, call_key
from kdispatch.kernels.triton.moe.fp8_grouped import FP8_MAX, QBLOCK, _e4m3_grid, _fused_route_layout, cdiv, next_pow2
from kdispatch.references import moe_fp8 as ref
from kdispatch.registry import variant

GATHER_ROWS = 16  # rows a gather program copies
GATHER_COLS = 1024  # activation bytes a gather step copies per row
QUANT_ROWS = 16  # rows a SiLU-and-quantise program takes (one 128-column block each)
COMBINE_COLS = 1024  # output columns a combine program writes
PSUM_CHUNK = 1024  # row blocks a psum step counts


@triton.jit
def _gather_rows_kernel(x_ptr, x_scale_ptr, row_pair_ptr, block_expert_ptr, a_ptr, a_scale_ptr, m_indices_ptr,
                        pair_row_ptr, num_tokens, num_rows,
                        HIDDEN: tl.constexpr, TOP_K: tl.constexpr, NUM_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr,
                        ROWS: tl.constexpr, COLS: tl.constexpr, KB: tl.constexpr, KB_POW2: tl.constexpr):
    tl.static_assert(BLOCK_M % ROWS == 0)  # a program's rows lie in one block: one expert
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    expert = tl.load(block_expert_ptr + tl.program_id(0) * ROWS // BLOCK_M)
    pair = tl.load(row_pair_ptr + rows)
    live = pair >= 0
    tl.store(m_indices_ptr + rows, tl.where(live, expert, -1))
    if expert >= NUM_LOCAL:
        return  # a block past the last expert (bound sizing): DeepGEMM skips it, nothing to copy
    token = tl.where(live, pair // TOP_K, 0).to(tl.int64)
    tl.store(pair_row_ptr + pair, rows, mask=live)
    r64 = rows.to(tl.int64)
    for c in range(0, HIDDEN, COLS):  # FP8 bytes, moved as uint8
        cols = c + tl.arange(0, COLS)
        inside = cols < HIDDEN
        x = tl.load(x_ptr + token[:, None] * HIDDEN + cols[None, :], mask=live[:, None] & inside[None, :], other=0)
        tl.store(a_ptr + r64[:, None] * HIDDEN + cols[None, :], x, mask=inside[None, :])
    kb = tl.arange(0, KB_POW2)
    s = tl.load(x_scale_ptr + kb[None, :] * num_tokens + token[:, None], mask=live[:, None] & (kb[None, :] < KB),
                other=0.0)  # the definition's scales are [H / 128, T]
    tl.store(a_scale_ptr + kb[None, :] * num_rows + r64[:, None], s, mask=kb[None, :] < KB)  # MN-major


@triton.jit
def _silu_mul_quant_kernel(h_ptr, block_expert_ptr, y_ptr, y_scale_ptr, num_rows, INTER: tl.constexpr,
                           NUM_LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr, QB: tl.constexpr,
                           ON_GRID: tl.constexpr):
    tl.static_assert(BLOCK_M % ROWS == 0)
    if tl.load(block_expert_ptr + tl.program_id(0) * ROWS // BLOCK_M) >= NUM_LOCAL:
        return  # past the last expert (bound sizing)
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    block = tl.program_id(1)
    cols = block * QB + tl.arange(0, QB)
    up = tl.load(h_ptr + rows[:, None] * (2 * INTER) + cols[None, :]).to(tl.float32)
    gate = tl.load(h_ptr + rows[:, None] * (2 * INTER) + INTER + cols[None, :]).to(tl.float32)
    y = up * gate * tl.sigmoid(gate)  # silu(second half) * first half, the definition's order
    scale = tl.maximum(tl.max(tl.abs(y), axis=1), 1e-10) / FP8_MAX
    q = y / scale[:, None]
    if ON_GRID:  # the interpreter's cast mis-rounds (see _e4m3_grid)
        q = _e4m3_grid(q)
    tl.store(y_ptr + rows[:, None] * INTER + cols[None, :], q.to(tl.float8e4nv))
    tl.store(y_scale_ptr + block * num_rows + rows, scale)  # MN-major


@triton.jit
def _combine_kernel(d_ptr, pair_row_ptr, pair_weight_ptr, out_ptr, HIDDEN: tl.constexpr, TOP_K: tl.constexpr,
                    COLS: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    inside = cols < HIDDEN
    acc = tl.zeros([COLS], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        row = tl.load(pair_row_ptr + token * TOP_K + k)
        if row >= 0:  # a pair routed to this rank
            w = tl.load(pair_weight_ptr + token * TOP_K + k)
            acc += w * tl.load(d_ptr + row.to(tl.int64) * HIDDEN + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * HIDDEN + cols, acc.to(tl.bfloat16), mask=inside)


@triton.jit
def _psum_kernel(row_pair_ptr, block_expert_ptr, psum_ptr, num_blocks, NUM_LOCAL: tl.constexpr,
                 BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    """Expert e's run ends at psum[e] = its start (128 x the blocks before it) + its rows: the routed
    rows of a run come first in it, so its last block holds them up to its first padding row."""
    e = tl.program_id(0)
    before = 0
    upto = 0
    for start in range(0, num_blocks, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        owner = tl.load(block_expert_ptr + offs, mask=offs < num_blocks, other=NUM_LOCAL)
        before += tl.sum((owner < e).to(tl.int32), axis=0)
        upto += tl.sum((owner <= e).to(tl.int32), axis=0)
    end = before * BLOCK_M
    if upto > before:
        last = (upto - 1) * BLOCK_M
        live = tl.load(row_pair_ptr + last + tl.arange(0, BLOCK_M)) >= 0
        end = last + tl.sum(live.to(tl.int32), axis=0)
    tl.store(psum_ptr + e, end)


def moe_fp8_deepgemm_fused(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                           gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                           routed_scaling_factor, *, bound: bool):
    import deep_gemm

    if not bound and hidden_states.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("deepgemm_fused sizes its rows from the routed counts, read back with a sync "
                           "that a CUDA graph capture does not allow (deepgemm_fused_bound does not)")
    num_tokens, hidden = hidden_states.shape
    num_local, two_inter, _ = gemm1_weights.shape
    inter = two_inter // 2
    device = hidden_states.device
    if hidden % QBLOCK or inter % QBLOCK:
        raise ValueError("deepgemm_fused: hidden and intermediate sizes must be multiples of 128")
    out = torch.empty(num_tokens, hidden, dtype=torch.bfloat16, device=device)  # every row written by the combine
    if num_tokens == 0:
        return out
    pair_weights, row_pair, block_expert = _fused_route_layout(
        routing_logits, routing_bias, local_expert_offset, routed_scaling_factor, num_local, BLOCK_M)
    if bound:
        rows = row_pair.numel()
    else:
        blocks = int((block_expert < num_local).sum())  # the sync: the experts' runs come first, in order
        if blocks == 0:
            return out.zero_()
        rows = blocks * BLOCK_M
    kb = hidden // QBLOCK
    x, x_scale = hidden_states.contiguous().view(torch.uint8), hidden_states_scale.contiguous()
    # the glue's four launches keyed once (the other buffers are fresh allocations or views of the routing's
    # workspace at fixed, aligned offsets)
    run = Launches((*call_key("moe_fp8 deepgemm_fused", x, x_scale), num_tokens, hidden, inter, num_local, bound))
    a = torch.empty(rows, hidden, dtype=torch.float8_e4m3fn, device=device)
    # Scales MN-major ([K / 128, rows] in memory, handed over as its [rows, K / 128] transpose), the layout
    # DeepGEMM's sm_90 kernels read: given row-major ones it transposes them first, a kernel of its own
    # per GEMM (rows are a multiple of 128, so the columns are TMA-aligned as they stand). Graph time 1-2% less
    # at 256-16,384 tokens (H200: benchmarks/results/moe-deepgemm-mn-scales-ab-H200.txt)
    a_scale = torch.empty(kb, rows, dtype=torch.float32, device=device).t()
    m_indices = torch.empty(rows, dtype=torch.int32, device=device)
    pair_row = torch.full((num_tokens * ref.TOP_K,), -1, dtype=torch.int32, device=device)
    run(_gather_rows_kernel, (rows // GATHER_ROWS,), x, x_scale, row_pair, block_expert, a.view(torch.uint8), a_scale,
        m_indices, pair_row, num_tokens, rows, hidden, ref.TOP_K, num_local, BLOCK_M, GATHER_ROWS, GATHER_COLS, kb,
        next_pow2(kb))
    if bound:  # DeepGEMM's psum layout: the routed blocks only
        psum = torch.empty(num_local, dtype=torch.int32, device=device)
        run(_psum_kernel, (num_local,), row_pair, block_expert, psum, block_expert.numel(), num_local, BLOCK_M,
            PSUM_CHUNK)
        # the rows an expert gets on average, for DeepGEMM's tile choice (the bound would pick prefill tiles;
        # for these two GEMMs a replica of its sm_90 cost model (get_best_config) picks 128 x 192 tiles in
        # 2-CTA clusters at any hint, as the kernel profiled at 1,770 tokens has: not a configuration to measure)
        expected = max(1, -(-num_tokens * ref.TOP_K // routing_logits.shape[1]))
        layout = dict(grouped_layout=psum, use_psum_layout=True, expected_m_for_psum_layout=expected)
    else:
        layout = dict(grouped_layout=m_indices)
    h = torch.empty(rows, two_inter, dtype=torch.bfloat16, device=device)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, a_scale), (gemm1_weights, gemm1_weights_scale), h, **layout)
    y = torch.empty(rows, inter, dtype=torch.float8_e4m3fn, device=device)
    y_scale = torch.empty(inter // QBLOCK, rows, dtype=torch.float32, device=device).t()
    run(_silu_mul_quant_kernel, (rows // QUANT_ROWS, inter // QBLOCK), h, block_expert, y, y_scale, rows, inter,
        num_local, BLOCK_M, QUANT_ROWS, QBLOCK, device.type != "cuda")
    d = torch.empty(rows, hidden, dtype=torch.bfloat16, device=device)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((y, y_scale), (gemm2_weights, gemm2_weights_scale), d, **layout)
    run(_combine_kernel, (num_tokens, cdiv(hidden, COMBINE_COLS)), d, pair_row, pair_weights, out,
        hidden, ref.TOP_K, COMBINE_COLS)
    return out


@variant("moe_fp8", "deepgemm_fused", backend="library", archs=("sm90",), requires=("deep_gemm",))
def moe_fp8_deepgemm_fused_counted(*args):
    return moe_fp8_deepgemm_fused(*args, bound=False)


@variant("moe_fp8", "deepgemm_fused_bound", backend="library", archs=("sm90",), requires=("deep_gemm",))
def moe_fp8_deepgemm_fused_bound(*args):
    return moe_fp8_deepgemm_fused(*args, bound=True)
