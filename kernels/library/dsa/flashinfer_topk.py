"""The DSA indexer with FlashInfer's fused top-k + page-table transform (`top_k_page_table_transform`,
the contest baseline's top-k: a radix select that writes page * 64 + slot directly) after the
project's Triton FP8 scoring (`kernels/triton/dsa/indexer_fp8.py`): the top-k half of the engines'
Hopper indexer, beside the Triton radix select and torch.topk. FlashInfer builds the kernel with
nvcc on its first call (over 8 minutes on an H100 host), from the CUDA sources
`benchmarks/stage_flashinfer_jit.sh` stages for the GPU machine, or loads a prebuilt module: the
variant runs only where the module is there already (`topk_module_ready`), so that no serving call
and no tuning run waits for a build.

FlashInfer maps the selected positions through the table without checking the entries (each
page * 64 + slot must be a non-negative int32), so what the definition allows there is settled
first: page ids outside [0, num_pages) are replaced by page 0 for the transform, their tokens'
scores set to -inf so that they are never chosen over a real token, and any of them still taken (a
row with fewer real tokens than 2048 within its length) comes out as -1 after the row's real ids, as
do the positions past a row's length (FlashInfer's padding). Lengths are clamped to the table's width.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.kernels.triton.dsa.indexer_fp8 import PAGE_SIZE, TOPK, score_pages
from kdispatch.kernels.triton.launch import launch
from kdispatch.registry import variant


@triton.jit
def _settle_pages_kernel(block_table_ptr, s_bt, seq_lens_ptr, scores_ptr, s_sc, table_ptr, lens_ptr,
                         max_pages, num_pages, PS: tl.constexpr, PB: tl.constexpr):
    """Before the transform, PB pages of row b: the table with page ids outside [0, num_pages) as
    page 0, their tokens' scores -inf; the first program of a row also clamps its length."""
    b = tl.program_id(0).to(tl.int64)
    pb = tl.program_id(1)
    offs_p = pb * PB + tl.arange(0, PB)
    inside = offs_p < max_pages
    page = tl.load(block_table_ptr + b * s_bt + offs_p, mask=inside, other=0)
    real = (page >= 0) & (page < num_pages)
    tl.store(table_ptr + b * max_pages + offs_p, tl.where(real, page, 0), mask=inside)
    offs_t = tl.arange(0, PS)
    tl.store(scores_ptr + b * s_sc + offs_p[:, None] * PS + offs_t[None, :],
             tl.full([PB, PS], float("-inf"), tl.float32), mask=(inside & ~real)[:, None])
    if pb == 0:
        n = tl.load(seq_lens_ptr + b)
        tl.store(lens_ptr + b, tl.minimum(tl.maximum(n, 0), max_pages * PS))


@triton.jit
def _keep_real_kernel(ids_ptr, raw_ptr, block_table_ptr, s_bt, out_ptr, s_out, num_pages,
                      PS: tl.constexpr, K: tl.constexpr):
    """After the transform, row b: its ids on real pages, in the transform's order, then -1."""
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, K)
    raw = tl.load(raw_ptr + b * K + offs)  # positions in the row, -1 after the selected ones
    ids = tl.load(ids_ptr + b * K + offs)
    taken = raw >= 0
    page = tl.load(block_table_ptr + b * s_bt + raw // PS, mask=taken, other=-1)
    keep = taken & (page >= 0) & (page < num_pages)
    slot = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    kept = tl.sum(keep.to(tl.int32), axis=0)
    tl.store(out_ptr + b * s_out + slot, ids, mask=keep)
    tl.store(out_ptr + b * s_out + offs, tl.full([K], -1, tl.int32), mask=offs >= kept)


PAGES_PER_PROGRAM = 16  # of the settling kernel: 16 x 64 scores a program


def flashinfer_topk_ids(scores, seq_lens, block_table, num_pages: int, out):
    """out <- the global ids of each row's (up to) 2048 best tokens among its first seq_len, in any
    order, -1 after them and for tokens on a page id outside [0, num_pages); scores [B, width]
    (rows may be padded, the last dimension contiguous; overwritten) is this call's own scratch.
    Two small kernels around FlashInfer's transform, where ~20 torch ops each cost the host a launch.
    Returns out."""
    import flashinfer

    batch, max_pages = block_table.shape
    dev = block_table.device
    table = torch.empty((batch, max_pages), dtype=torch.int32, device=dev)
    lens = torch.empty(batch, dtype=torch.int32, device=dev)
    launch(_settle_pages_kernel, (batch, triton.cdiv(max_pages, PAGES_PER_PROGRAM)),
           block_table, block_table.stride(0), seq_lens, scores, scores.stride(0), table, lens, max_pages,
           num_pages, PAGE_SIZE, PAGES_PER_PROGRAM)
    ids = torch.empty((batch, TOPK), dtype=torch.int32, device=dev)
    raw = torch.empty_like(ids)
    flashinfer.top_k_page_table_transform(scores, table, lens, TOPK, page_size=PAGE_SIZE, out=ids,
                                          out_raw_indices=raw)
    # the definition wants a row's ids first and its -1s after: where the selection reached tokens
    # of invalid pages (fewer real tokens than 2048 within the length), the gaps they leave close
    launch(_keep_real_kernel, (batch,), ids, raw, block_table, block_table.stride(0), out, out.stride(0),
           num_pages, PAGE_SIZE, TOPK, num_warps=8)
    return out


def topk_module_ready() -> str | None:
    """None when FlashInfer's "topk" module is built (a prebuilt AOT module, or its JIT cache's), else
    why not: calling it would first compile it for minutes."""
    from flashinfer.jit.topk import gen_topk_module

    spec = gen_topk_module()
    if spec.is_aot or spec.jit_library_path.exists():
        return None
    return ("FlashInfer's top-k module is not built (its first call compiles it with nvcc for minutes): "
            "build it once, as benchmarks/stage_flashinfer_jit.sh's setup does, or install it prebuilt")


@variant("dsa_topk_indexer", "triton_fp8_flashinfer_topk", backend="library", archs=("sm90",),
         requires=("triton", "flashinfer"), ready=topk_module_ready)
def dsa_indexer_triton_flashinfer_topk(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    batch, max_pages = block_table.shape
    if batch == 0 or max_pages == 0:
        return torch.full((batch, TOPK), -1, dtype=torch.int32, device=block_table.device)
    out = torch.empty((batch, TOPK), dtype=torch.int32, device=block_table.device)
    scores = score_pages(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)
    return flashinfer_topk_ids(scores, seq_lens, block_table, k_index_cache_fp8.shape[0], out)
