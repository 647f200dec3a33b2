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

from kdispatch.kernels.triton.dsa.indexer_fp8 import PAGE_SIZE, TOPK, score_pages
from kdispatch.registry import variant


def flashinfer_topk_ids(scores, seq_lens, block_table, num_pages: int, out):
    """out <- the global ids of each row's (up to) 2048 best tokens among its first seq_len, in any
    order, -1 after them and for tokens on a page id outside [0, num_pages); scores [B, width]
    (contiguous, overwritten) is this call's own scratch. Returns out."""
    import flashinfer

    batch, max_pages = block_table.shape
    width = max_pages * PAGE_SIZE
    real = (block_table >= 0) & (block_table < num_pages)  # [B, pages]
    table = torch.where(real, block_table, 0).to(torch.int32)
    scores.view(batch, max_pages, PAGE_SIZE).masked_fill_(~real[:, :, None], float("-inf"))
    lens = seq_lens.clamp(0, width).to(torch.int32)
    raw = torch.empty_like(out)
    flashinfer.top_k_page_table_transform(scores, table, lens, TOPK, page_size=PAGE_SIZE, out=out,
                                          out_raw_indices=raw)
    taken = raw >= 0
    keep = taken & torch.gather(real, 1, torch.where(taken, raw, 0).long() // PAGE_SIZE)
    # the definition wants a row's ids first and its -1s after: a stable sort on "dropped" closes
    # the gaps the invalid pages' tokens leave (a small sort: [B, 2048] keys)
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    out.copy_(torch.gather(out.masked_fill_(~keep, -1), 1, order))
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
    out = torch.full((batch, TOPK), -1, dtype=torch.int32, device=block_table.device)
    if batch == 0 or max_pages == 0:
        return out
    scores = score_pages(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)
    return flashinfer_topk_ids(scores, seq_lens, block_table, k_index_cache_fp8.shape[0], out)
