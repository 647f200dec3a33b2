"""DSA top-k indexer, pass-through regime, as one Triton kernel (one launch per call).

Definition: dsa_topk_indexer_fp8_h64_d128_topk2048_ps64. When `max_num_pages * 64 <= 2048` every
cached token is in the top 2048, so the answer is each sequence's valid global token ids page * 64 +
slot in any order (FlashInfer-Bench compares selected sets), then -1 padding (the reference's padding
rule: a page id outside [0, num_pages) contributes no token); q, the key cache and the
weights are not read. kernels/torch/dsa/indexer_passthrough.py computes the same with half a dozen
torch ops (a launch each); this kernel does it in one: program b writes row b's 2048 entries.
"""
import torch
import triton
import triton.language as tl

from kdispatch.registry import variant

PAGE_SIZE = 64
TOPK = 2048


@triton.jit
def _passthrough_kernel(seq_lens_ptr, block_table_ptr, out_ptr, max_pages, num_pages, s_bt,
                        PS: tl.constexpr, TOPK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b), max_pages * PS)
    offs = tl.arange(0, TOPK)
    live = offs < seq_len
    page = tl.load(block_table_ptr + b * s_bt + offs // PS, mask=live, other=-1)
    valid = live & (page >= 0) & (page < num_pages)  # a page id out of range makes its tokens padding
    slot = tl.cumsum(valid.to(tl.int32), axis=0) - 1  # valid tokens first, in token order
    tl.store(out_ptr + b * TOPK + slot, page * PS + offs % PS, mask=valid)
    tl.store(out_ptr + b * TOPK + offs, tl.full([TOPK], -1, tl.int32), mask=offs > tl.max(slot, axis=0))


@variant("dsa_topk_indexer", "triton_passthrough", backend="triton", archs=("sm90",), requires=("triton",),
         supports=lambda f: None if f["max_num_pages"] * PAGE_SIZE <= TOPK else
         f"more than {TOPK} cached tokens a row: a top-k is needed")
def indexer_passthrough_triton(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    batch, pages = block_table.shape
    if pages * PAGE_SIZE > TOPK:
        raise ValueError(f"pass-through needs max_num_pages * 64 <= 2048, got {pages} pages")
    out = torch.empty(batch, TOPK, dtype=torch.int32, device=block_table.device)
    if batch:
        _passthrough_kernel[(batch,)](seq_lens, block_table, out, pages, k_index_cache_fp8.shape[0],
                                      block_table.stride(0),
                                      PS=PAGE_SIZE, TOPK=TOPK, num_warps=4)
    return out
