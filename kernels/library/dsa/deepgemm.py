"""DeepGEMM's paged MQA logits (`fp8_paged_mqa_logits`, DeepGEMM 2.6.1 built on the GPU machine by
benchmarks/stage_deepgemm.sh) followed by a top-k: the DeepSeek-V3.2 indexer as SGLang 0.5.23 runs
it on Hopper for decode (`dsa_indexer.py`, `_get_topk_paged`: DeepGEMM's logits, then a top-k over
each row's first seq_len columns mapped through the page table; SGLang's default top-k is a JIT CUDA
kernel). The baseline of dsa_topk_indexer on sm_90, in this order: `deepgemm_flashinfer_topk`
(FlashInfer's fused top-k + page-table transform, the contest baseline's top-k, where its module is
built: kernels/library/dsa/flashinfer_topk.py), else `deepgemm_torch_topk` (`torch.topk`, SGLang's
"torch" top-k backend); without DeepGEMM the reference stands in, and `kdispatch list` says why.

The engine's call, and what the definition's padding rule adds to it:
- q [B, 64, 128] FP8 goes in as [B, 1, 64, 128] (next_n = 1), the FP8 key cache's bytes as the
  uint8 [pages, 64, 1, 132] view DeepGEMM takes (the definition's byte layout is DeepGEMM's),
  context lengths as [B, 1] int32 (DeepGEMM >= 2.4), clamped to [0, max_num_pages * 64].
- DeepGEMM reads the first ceil(len / 64) block-table entries of a row without checking them: ids
  outside [0, num_pages) are replaced by page 0 first (one launch) and their tokens masked after.
- The logits past a row's length are not cleaned by DeepGEMM (its `clean_logits` is refused for
  2-D lengths): the top-k masks them, as every SGLang top-k does.
- Batches are cut into chunks of at most `get_num_sms()` rows, each with its own schedule, as
  SGLang does.
"""
from __future__ import annotations

import torch

from kdispatch.kernels.library.dsa.flashinfer_topk import flashinfer_topk_ids, topk_module_ready
from kdispatch.kernels.triton.dsa.indexer_fp8 import PAGE_SIZE, TOPK, torch_topk_ids
from kdispatch.registry import variant


def dsa_indexer_deepgemm(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, *, select=torch_topk_ids):
    """`select(logits, seq_lens, block_table, num_pages, out)` writes each row's ids into out."""
    import deep_gemm

    batch, max_pages = block_table.shape
    num_pages = k_index_cache_fp8.shape[0]
    out = torch.full((batch, TOPK), -1, dtype=torch.int32, device=block_table.device)
    if batch == 0 or max_pages == 0 or num_pages == 0:
        return out
    width = max_pages * PAGE_SIZE
    lens = seq_lens.clamp(0, width).to(torch.int32).view(batch, 1)
    table = torch.where((block_table >= 0) & (block_table < num_pages), block_table, 0).to(torch.int32)
    q = q_index_fp8.unsqueeze(1).contiguous()
    kv = k_index_cache_fp8.view(torch.uint8)
    w = weights.to(torch.float32).contiguous()
    num_sms = deep_gemm.get_num_sms()
    for start in range(0, batch, num_sms):
        rows = slice(start, start + num_sms)
        schedule = deep_gemm.get_paged_mqa_logits_metadata(lens[rows].contiguous(), PAGE_SIZE, num_sms)
        logits = deep_gemm.fp8_paged_mqa_logits(q[rows], kv, w[rows], lens[rows].contiguous(), table[rows], schedule,
                                                width, clean_logits=False)
        select(logits, seq_lens[rows], block_table[rows], num_pages, out[rows])
    return out


def dsa_indexer_deepgemm_flashinfer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    return dsa_indexer_deepgemm(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table,
                                select=flashinfer_topk_ids)


# registration order is the baseline's order of preference (registry.baseline)
variant("dsa_topk_indexer", "deepgemm_flashinfer_topk", backend="library", archs=("sm90",), baseline=True,
        requires=("deep_gemm", "flashinfer"), ready=topk_module_ready)(dsa_indexer_deepgemm_flashinfer)
variant("dsa_topk_indexer", "deepgemm_torch_topk", backend="library", archs=("sm90",), baseline=True,
        requires=("deep_gemm",))(dsa_indexer_deepgemm)
