"""DSA top-k indexer: CUDA FP8 wgmma scoring (indexer_score.cu), then the CUDA radix select.

    q_index_fp8        [B, 64, 128] float8_e4m3fn      k_index_cache_fp8  [num_pages, 64, 1, 132] int8
    weights            [B, 64] fp32                    seq_lens           [B] int32
    block_table        [B, max_num_pages] int32        -> topk_indices    [B, 2048] int32

The select is `cuda_radix_select`'s (topk_select.cu); the scoring differs from its Triton one: each
CTA (one warpgroup) scores one or two pages of one row (`pages_per_cta`), with the queries copied into
shared memory once and the pages streamed through a 4-stage cp.async ring, one wgmma chain a page.
Two launches, no host sync (CUDA-graph safe), the select a programmatic dependent launch (PDL) that
overlaps the scoring's tail (0.6-0.8 us a call on an H100, 2026-11-23); rows of up to 8192 tokens.
Both kernels compile on first call through NVRTC (sm_90a; cached on disk, see kdispatch.nvrtc).
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from kdispatch import nvrtc
from kdispatch.kernels.cuda.dsa import indexer_select
from kdispatch.registry import variant

CU = Path(__file__).with_name("indexer_score.cu")
SIGNATURE = "ppppppiiii"  # q cache w seq_lens block_table scores, max_pages num_pages s_bt pages_per_cta
HEADS, HEAD_DIM, PAGE_SIZE = 64, 128, 64


@functools.cache  # loaded once, on first call (importing compiles nothing)
def kernel() -> nvrtc.Kernel:
    return nvrtc.load_kernel(CU, "dsa_index_score", signature=SIGNATURE)


def pages_per_cta(batch: int, max_pages: int) -> int:
    """One page a CTA up to 2048 CTAs, then two. H100 (2026-11-23, scoring alone, CUDA graph, rotated
    inputs; pages a CTA 1 / 2 / 4): B=4 x 34 pages 2.82 / 3.15 / 3.86 us, B=12 x 82 3.90 / 4.47 / 4.90,
    B=27 x 82 6.01 / 5.72 / 6.62, B=30 x 91 7.20 / 6.68 / 8.08. A CTA's pages run one after another at
    about 0.45 us each, even with all 4 in flight from the start, so a small grid wants one page a CTA."""
    return 1 if batch * max_pages <= 2048 else 2


def score_pages(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, *, pages: int | None = None):
    """fp32 scores [B, max_num_pages * 64] of the rows longer than 2048 tokens; other slots (past
    seq_len, and every slot of a shorter row) are left unwritten. `pages` (pages a CTA) overrides
    `pages_per_cta` (tests, benchmarks)."""
    batch, heads, dim = q_index_fp8.shape
    num_pages = k_index_cache_fp8.shape[0]
    max_pages = block_table.shape[1]
    if (heads, dim) != (HEADS, HEAD_DIM) or tuple(k_index_cache_fp8.shape[1:]) != (PAGE_SIZE, 1, HEAD_DIM + 4):
        raise ValueError("expected q [B, 64, 128] and a [num_pages, 64, 1, 132] key cache")
    pages = pages or pages_per_cta(batch, max_pages)
    if pages < 1:
        raise ValueError(f"pages a CTA must be positive, got {pages}")
    scores = torch.empty(batch, max_pages * PAGE_SIZE, dtype=torch.float32, device=q_index_fp8.device)
    if batch == 0 or max_pages == 0:
        return scores
    cache, q = k_index_cache_fp8.contiguous(), q_index_fp8.contiguous()
    if cache.data_ptr() % 16 or q.data_ptr() % 16:
        raise ValueError("the key cache and the queries must be 16-byte aligned (the kernel copies 16-byte chunks)")
    block_table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    kernel().launch((batch, -(-max_pages // pages)), 128, q, cache, weights.contiguous(),
                    seq_lens.contiguous(), block_table, scores, max_pages, num_pages, block_table.stride(0),
                    pages, stream=nvrtc.current_stream(q.get_device()))
    return scores


@variant("dsa_topk_indexer", "cuda_wgmma_radix", backend="cuda", archs=("sm90",), requires=("cuda.core",),
         supports=lambda f: None if f["max_num_pages"] * PAGE_SIZE <= indexer_select.MAX_WIDTH else
         f"rows over {indexer_select.MAX_WIDTH} tokens ({indexer_select.MAX_WIDTH // PAGE_SIZE} pages)")
def dsa_indexer_cuda_wgmma_radix(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    out, complete = indexer_select.new_output(block_table, "cuda_wgmma_radix")
    if complete:
        return out
    scores = score_pages(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)
    return indexer_select.select(scores, seq_lens, block_table, out, k_index_cache_fp8.shape[0], pdl=True)
