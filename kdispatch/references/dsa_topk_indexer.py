"""DeepSeek-V3.2 sparse-attention top-k indexer over an FP8 paged key cache (kdispatch reference).

For sequence b with L = seq_lens[b] cached tokens (token j lives in page block_table[b, j // 64]
at slot j % 64), each token gets the score

    score[j] = sum_h weights[b, h] * relu(q[b, h] . key[j])

and the result is the global ids page * 64 + slot of the min(2048, n) best of the n valid tokens,
best first, padded with -1.

Padding rule (any int32 value is safe): L is clamped to [0, max_num_pages * 64]; a token whose
block-table entry is outside [0, num_pages) is not valid (never selected, never read). Entries past
a sequence's end are never read.

Cache byte layout (deep_gemm): each page is 64 * 132 bytes: first the 64 keys as 64 * 128 FP8
(e4m3) bytes, then the 64 per-token dequantisation scales as 64 little-endian float32 values. The
[num_pages, 64, 1, 132] int8 shape is only a view of those bytes; token t's key is NOT bytes
[t, 0, 0:128] of it.

The whole batch is scored at once: each sequence is padded to the block-table width, only the
pages the batch refers to are dequantised, and slots past a sequence's end are masked with -inf
before top-k.
"""
import torch

TOPK = 2048
PAGE_SIZE = 64


@torch.no_grad()
def run(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    """Select the 2048 highest-scoring cached tokens per sequence.

    Args:
        q_index_fp8: [B, 64, 128] float8_e4m3fn, indexer queries.
        k_index_cache_fp8: [num_pages, 64, 1, 132] int8, the FP8 key cache in deep_gemm page
            layout (see module docstring).
        weights: [B, 64] float32, per-head weights (already folding in every softmax/quant scale).
        seq_lens: [B] int32, cached tokens per sequence (0 allowed; clamped to
            [0, max_num_pages * 64]).
        block_table: [B, max_num_pages] int32, page ids of each sequence; entries past
            ceil(seq_len / 64) are ignored, and a page id outside [0, num_pages) makes its 64
            tokens padding.

    Returns:
        topk_indices: [B, 2048] int32, global token ids (page * 64 + slot), best first, -1 padded.
    """
    batch, num_heads, head_dim = q_index_fp8.shape
    num_pages, page_size, kv_heads, head_dim_with_scale = k_index_cache_fp8.shape
    assert num_heads == 64 and head_dim == 128
    assert page_size == PAGE_SIZE and kv_heads == 1 and head_dim_with_scale == head_dim + 4
    device = q_index_fp8.device
    max_pages = block_table.shape[1]
    width = max_pages * page_size

    result = torch.full((batch, TOPK), -1, dtype=torch.int32, device=device)
    if batch == 0 or width == 0 or num_pages == 0:
        return result

    lens = seq_lens.to(device=device, dtype=torch.long)  # [B]
    page_pos = torch.arange(max_pages, device=device)
    table = block_table.to(device=device, dtype=torch.long)
    page_ok = (page_pos[None, :] * page_size < lens[:, None]) & (table >= 0) & (table < num_pages)  # [B, max_pages]
    pages = torch.where(page_ok, table, 0)  # [B, max_pages]

    # Dequantise just the referenced pages: [B, max_pages, page_bytes] -> [B, width, head_dim] float32.
    raw = k_index_cache_fp8.view(torch.uint8).reshape(num_pages, page_size * head_dim_with_scale)
    raw = raw[pages]  # [B, max_pages, page_bytes]
    key_bytes = raw[..., : page_size * head_dim].contiguous()
    scale_bytes = raw[..., page_size * head_dim :].contiguous()
    keys = key_bytes.view(torch.float8_e4m3fn).to(torch.float32).view(batch, max_pages, page_size, head_dim)
    key_scale = scale_bytes.view(torch.float32).view(batch, max_pages, page_size, 1)
    keys = (keys * key_scale).view(batch, width, head_dim)

    logits = torch.matmul(q_index_fp8.to(torch.float32), keys.transpose(1, 2))  # [B, H, width]
    scores = (torch.relu(logits) * weights.to(torch.float32)[:, :, None]).sum(dim=1)  # [B, width]
    slot = torch.arange(width, device=device)
    valid = (slot[None, :] < lens[:, None]) & page_ok.repeat_interleave(page_size, dim=1)  # [B, width]
    scores = scores.masked_fill(~valid, float("-inf"))

    k = min(TOPK, width)
    _, best = torch.topk(scores, k, dim=1)  # [B, k] positions within the padded sequence
    token_ids = torch.gather(pages, 1, best // page_size) * page_size + best % page_size
    token_ids = torch.where(torch.gather(valid, 1, best), token_ids, -1)
    result[:, :k] = token_ids.to(torch.int32)
    return result
