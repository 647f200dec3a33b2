"""DSA top-k indexer: the Triton FP8 scoring kernel, then an exact radix top-k select in CUDA.

    q_index_fp8        [B, 64, 128] float8_e4m3fn      k_index_cache_fp8  [num_pages, 64, 1, 132] int8
    weights            [B, 64] fp32                    seq_lens           [B] int32
    block_table        [B, max_num_pages] int32        -> topk_indices    [B, 2048] int32

Scoring is kernels/triton/dsa/indexer_fp8.py `score_pages` (rows of at most 2048 tokens are not
scored); selection is topk_select.cu, one 1024-thread CTA per row with the row's scores in
registers and up to three 11/11/10-bit radix passes (the Triton select needs four 8-bit ones, and
was measured at ~15 us of the ~18 us call on an H100). Two launches, no host sync (CUDA-graph safe).
Rows of up to 8192 tokens (max_num_pages <= 128); the kernel compiles on first call through NVRTC
(cached on disk, see kdispatch.nvrtc).
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from kdispatch import nvrtc
from kdispatch.kernels.triton.dsa import indexer_fp8
from kdispatch.registry import variant

CU = Path(__file__).with_name("topk_select.cu")
SIGNATURE = "ppppiii"  # scores seq_lens block_table out, width s_bt num_pages
TOPK, PAGE_SIZE = 2048, 64
MAX_WIDTH = 8192  # scores per row the CTA holds in registers (1024 threads x 8)


@functools.cache  # loaded once, on first call (importing compiles nothing)
def kernel() -> nvrtc.Kernel:
    return nvrtc.load_kernel(CU, "dsa_topk_select", signature=SIGNATURE)


@variant("dsa_topk_indexer", "cuda_radix_select", backend="cuda", archs=("sm90",), requires=("triton", "cuda.core"),
         supports=lambda f: None if f["max_num_pages"] * PAGE_SIZE <= MAX_WIDTH else
         f"rows over {MAX_WIDTH} tokens ({MAX_WIDTH // PAGE_SIZE} pages)")
def dsa_indexer_cuda_radix_select(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, *,
                                  pages: int | None = None):
    out, complete = new_output(block_table, "cuda_radix_select")
    if complete:
        return out
    scores = indexer_fp8.score_pages(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table,
                                     skip_short=True, pages=pages)
    return select(scores, seq_lens, block_table, out, k_index_cache_fp8.shape[0])


def new_output(block_table: torch.Tensor, variant_name: str) -> tuple[torch.Tensor, bool]:
    """The [B, 2048] int32 output for `block_table` [B, max_num_pages], and whether it is already
    complete (no rows; or no pages, so all -1) and needs no kernel. Raises for rows wider than the
    select holds."""
    batch, max_pages = block_table.shape
    if max_pages * PAGE_SIZE > MAX_WIDTH:
        raise ValueError(f"{variant_name} holds rows of at most {MAX_WIDTH} tokens (max_num_pages <= {MAX_WIDTH // PAGE_SIZE})")
    out = torch.empty(batch, TOPK, dtype=torch.int32, device=block_table.device)
    if max_pages == 0:
        out.fill_(-1)
    return out, batch == 0 or max_pages == 0


def select(scores, seq_lens, block_table, out, num_pages: int, *, pdl: bool = False):
    """Write the top-2048 valid token ids of each row of `scores` [B, max_num_pages * 64] into `out`
    [B, 2048] (a row of at most 2048 valid tokens: all of them, its scores unread); returns `out`.
    Valid: before seq_len, on a page id inside [0, num_pages) (the reference's padding rule).
    `pdl`: launch as a programmatic dependent of the scoring kernel just launched, which must
    execute `griddepcontrol.launch_dependents` (see kdispatch.nvrtc.Kernel)."""
    seq_lens = seq_lens.contiguous()
    block_table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    kernel().launch(block_table.shape[0], 1024, scores, seq_lens, block_table, out, scores.shape[1],
                    block_table.stride(0), num_pages, stream=nvrtc.current_stream(block_table.get_device()), pdl=pdl)
    return out
