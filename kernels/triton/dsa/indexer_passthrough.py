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

from kdispatch.kernels.triton.launch import launch
from kdispatch.registry import variant

PAGE_SIZE = 64
TOPK = 2048


@triton.jit
def _passthrough_kernel(seq_lens_ptr, block_table_ptr, out_ptr, max_pages, num_pages, s_bt,
                        PS: tl.constexpr, TOPK: tl.constexpr):
    # Compacted a page at a time: only a sequence's last page is partial, so a valid token's place is
    # the valid tokens of the pages before its own plus its slot. A scan over the 32 page positions
    # instead of the 2048 tokens (which took the call from 1.3 to 2.6 us on an H100).
    b = tl.program_id(0).to(tl.int64)
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b), max_pages * PS)
    p = tl.arange(0, TOPK // PS)
    reached = p * PS < seq_len
    page = tl.load(block_table_ptr + b * s_bt + p, mask=reached, other=-1)
    ok = reached & (page >= 0) & (page < num_pages)  # a page id out of range makes its tokens padding
    tokens = tl.where(ok, tl.minimum(seq_len - p * PS, PS), 0)  # valid tokens of each page
    first = tl.cumsum(tokens, axis=0) - tokens  # where each page's tokens go
    slot = tl.arange(0, PS)
    tl.store(out_ptr + b * TOPK + first[:, None] + slot[None, :], page[:, None] * PS + slot[None, :],
             mask=slot[None, :] < tokens[:, None])
    offs = tl.arange(0, TOPK)
    tl.store(out_ptr + b * TOPK + offs, tl.full([TOPK], -1, tl.int32), mask=offs >= tl.sum(tokens, axis=0))


@variant("dsa_topk_indexer", "triton_passthrough", backend="triton", archs=("sm90",), requires=("triton",),
         supports=lambda f: None if f["max_num_pages"] * PAGE_SIZE <= TOPK else
         f"more than {TOPK} cached tokens a row: a top-k is needed")
def indexer_passthrough_triton(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    batch, pages = block_table.shape
    if pages * PAGE_SIZE > TOPK:
        raise ValueError(f"pass-through needs max_num_pages * 64 <= 2048, got {pages} pages")
    out = torch.empty(batch, TOPK, dtype=torch.int32, device=block_table.device)
    if batch:  # launch(): without the JIT call's per-call binding, a few us less host time (README)
        launch(_passthrough_kernel, (batch,), seq_lens, block_table, out, pages, k_index_cache_fp8.shape[0],
               block_table.stride(0), PAGE_SIZE, TOPK, num_warps=4)
    return out
