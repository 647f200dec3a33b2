"""DeepSeek-V3.2 sparse MLA attention over top-k selected cache tokens (kdispatch reference).

Each query token t attends, with all 16 heads, to the cache tokens listed in sparse_indices[t]
(global ids page * 64 + slot; -1 marks an unused entry, and so does any value outside
[0, num_pages * 64): no index value reads outside the cache). Keys are the concatenation of the
compressed KV (512) and the rope part (64); values are the compressed KV alone:

    logit[h, j] = sm_scale * (q_nope[t, h] . ckv[j] + q_pe[t, h] . kpe[j])
    output[t, h] = softmax_j(logit[h]) @ ckv
    lse[t, h]    = log2(sum_j exp(logit[h, j]))         (base 2)

A token with no valid index gets a zero output and lse = -inf. Computed in float32 for a block of
query tokens at a time, all heads and all selected tokens together, with unused entries masked out.
"""
import math

import torch

TOKENS_PER_BLOCK = 64  # bounds the gathered [tokens, 2048, 576] float32 working set (~300 MB)


@torch.no_grad()
def run(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    """Sparse attention of each query token over its selected cache tokens.

    Args:
        q_nope: [num_tokens, 16, 512] bfloat16, query in the compressed-KV space.
        q_pe: [num_tokens, 16, 64] bfloat16, rope part of the query.
        ckv_cache: [num_pages, 64, 512] bfloat16, compressed KV cache (keys and values).
        kpe_cache: [num_pages, 64, 64] bfloat16, rope key cache.
        sparse_indices: [num_tokens, 2048] int32, global cache token ids; -1, or any value outside
            [0, num_pages * 64), for unused entries.
        sm_scale: float, softmax scale applied to the logits.

    Returns:
        output: [num_tokens, 16, 512] bfloat16.
        lse: [num_tokens, 16] float32, base-2 log-sum-exp of the scaled logits (-inf for a token
            without any valid index).
    """
    num_tokens, num_heads, dim_ckv = q_nope.shape
    dim_kpe = q_pe.shape[-1]
    num_pages, page_size, _ = ckv_cache.shape
    topk = sparse_indices.shape[-1]
    assert num_heads == 16 and dim_ckv == 512 and dim_kpe == 64
    assert page_size == 64 and topk == 2048
    assert sparse_indices.shape[0] == num_tokens
    device = q_nope.device
    sm_scale = float(sm_scale)

    ckv_flat = ckv_cache.reshape(num_pages * page_size, dim_ckv)
    kpe_flat = kpe_cache.reshape(num_pages * page_size, dim_kpe)
    output = torch.empty(num_tokens, num_heads, dim_ckv, dtype=torch.bfloat16, device=device)
    lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=device)

    if num_pages == 0:  # every index is unused
        return output.zero_(), lse.fill_(float("-inf"))
    for lo in range(0, num_tokens, TOKENS_PER_BLOCK):
        hi = min(lo + TOKENS_PER_BLOCK, num_tokens)
        idx = sparse_indices[lo:hi].to(torch.long)  # [n, topk]
        valid = (idx >= 0) & (idx < num_pages * page_size)
        idx = torch.where(valid, idx, 0)
        ckv = ckv_flat[idx].to(torch.float32)  # [n, topk, 512]
        kpe = kpe_flat[idx].to(torch.float32)  # [n, topk, 64]
        qn = q_nope[lo:hi].to(torch.float32)  # [n, H, 512]
        qp = q_pe[lo:hi].to(torch.float32)  # [n, H, 64]

        logits = torch.matmul(qn, ckv.transpose(1, 2)) + torch.matmul(qp, kpe.transpose(1, 2))  # [n, H, topk]
        logits = (logits * sm_scale).masked_fill(~valid[:, None, :], float("-inf"))
        row_max = logits.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        p = torch.exp(logits - row_max)  # exactly 0 at masked entries
        denom = p.sum(dim=-1, keepdim=True)  # [n, H, 1], 0 for a token without valid index
        out = torch.matmul(p, ckv) / denom.clamp_min(torch.finfo(torch.float32).tiny)
        output[lo:hi] = out.to(torch.bfloat16)
        lse[lo:hi] = ((torch.log(denom) + row_max).squeeze(-1)) / math.log(2.0)
    return output, lse
