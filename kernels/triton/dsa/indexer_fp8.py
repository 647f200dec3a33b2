"""DSA top-k indexer, scored regime: FP8 tensor-core scoring of the paged cache, then a top-k select.

Definition: dsa_topk_indexer_fp8_h64_d128_topk2048_ps64 (math in kdispatch/references/
dsa_topk_indexer.py). Two kernels, no host sync (CUDA-graph safe):

1. `_score_pages_kernel`, grid (B, ceil(max_num_pages / PAGES)): each program scores PAGES pages of
   one sequence. Per page it reads the 64 FP8 keys (8 KB) and their 64 fp32 scales straight from the
   deep_gemm page bytes (no dequantised copy), computes the [64 tokens, 64 heads] logits with one FP8
   tl.dot of the keys against the sequence's transposed FP8 queries (loaded once per program), and
   reduces them at once: score[t] = sum_h w[h] * relu(logit[t, h] * key_scale[t]). Tokens are the
   dot's rows so that the head reduction stays within each warp's rows of the accumulator; with
   heads as rows it crossed warps, and the scoring took 25-30% longer on the large scored shapes
   (H100, 2026-11-23: 9.6 against 6.9 us at B=30 x 91 pages, 5.9 against 4.3 at B=31 x 43, graph
   time, rotated inputs; 2.8 against 3.0 at B=4 x 34). Pages past the sequence's end are
   skipped. Writes fp32 scores [B, max_num_pages * 64] (slots past seq_len hold garbage and are
   never selected).
2. Selection, one of:
   - `_radix_select_kernel`, one program per sequence with the whole row in registers. Valid tokens
     are those before seq_len on a page id inside [0, num_pages) (the reference's padding rule). A
     row of at most 2048 valid tokens takes all of them (a row of at most 2048 tokens is not even
     scored). Otherwise it maps each
     score to an order-preserving 32-bit key, finds the k-th largest key (k = 2048)
     with four 8-bit radix passes (tl.histogram of the digit among keys matching the prefix found so
     far), then writes every key above it plus as many keys equal to it as are still needed
     (lowest positions first), as global token ids page * 64 + slot, then -1 padding. Not sorted
     by score: the definition's evaluator compares selected sets (FlashInfer-Bench: reachable, no
     duplicates, equal sorted scores). Rows up to RADIX_MAX_WIDTH tokens.
   - torch.topk on the score rows (any width): sorted, one library call.

Scores match the reference's up to fp32 summation order (FP8 products are exact in the tensor
cores' fp32 accumulation), so near-ties at the k-th score may pick a different, equally scored token.

DOT_FP32: the Triton interpreter (CPU tests) has no FP8 dot; operands are cast to fp32 when set
(only off CUDA).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.registry import variant

TOPK = 2048
PAGE_SIZE = 64
HEADS = 64
HEAD_DIM = 128
PAGE_BYTES = PAGE_SIZE * (HEAD_DIM + 4)  # 64 FP8 keys, then 64 fp32 scales
RADIX_MAX_WIDTH = 8192  # tokens per row the register-resident radix select handles


@triton.jit
def _score_pages_kernel(
    q_ptr, k_fp8_ptr, k_f32_ptr, w_ptr, seq_lens_ptr, block_table_ptr, scores_ptr,
    max_pages, num_pages, s_bt,
    H: tl.constexpr, D: tl.constexpr, PS: tl.constexpr, PAGES: tl.constexpr, SKIP_SHORT: tl.constexpr,
    TOPK: tl.constexpr, DOT_FP32: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    p0 = tl.program_id(1) * PAGES
    seq_len = tl.load(seq_lens_ptr + b)
    offs_t = tl.arange(0, PS)
    if p0 * PS >= seq_len:
        if not SKIP_SHORT:  # torch.topk reads whole rows: write the -inf it would mask there anyway
            for i in tl.static_range(PAGES):
                if p0 + i < max_pages:
                    tl.store(scores_ptr + b * max_pages * PS + (p0 + i) * PS + offs_t, tl.full([PS], float("-inf"), tl.float32))
        return
    if SKIP_SHORT and seq_len <= TOPK:  # the selection takes every token of this row unscored
        return
    offs_h = tl.arange(0, H)
    offs_d = tl.arange(0, D)
    q_t = tl.load(q_ptr + b * (H * D) + offs_h[None, :] * D + offs_d[:, None])  # [D, H] fp8
    w = tl.load(w_ptr + b * H + offs_h)  # [H] fp32
    if DOT_FP32:
        q_t = q_t.to(tl.float32)
    width = max_pages * PS
    for i in tl.static_range(PAGES):
        pos = p0 + i
        if (pos < max_pages) & (pos * PS < seq_len):
            page = tl.load(block_table_ptr + b * s_bt + pos).to(tl.int64)
            ok = (page >= 0) & (page < num_pages)
            page = tl.where(ok, page, 0)
            # page bytes: keys at [t * D + d], scales as fp32 at byte PS * D + 4 t
            k = tl.load(k_fp8_ptr + page * (PS * (D + 4)) + offs_t[:, None] * D + offs_d[None, :])  # [PS, D]
            k_scale = tl.load(k_f32_ptr + page * (PS * (D + 4) // 4) + (PS * D // 4) + offs_t)  # [PS]
            if DOT_FP32:
                k = k.to(tl.float32)
            logits = tl.dot(k, q_t) * k_scale[:, None]  # [PS, H] fp32
            score = tl.sum(tl.maximum(logits, 0.0) * w[None, :], axis=1)  # [PS]
            score = tl.where(ok, score, 0.0)
            tl.store(scores_ptr + b * width + pos * PS + offs_t, score)
        elif (pos < max_pages) & (not SKIP_SHORT):
            tl.store(scores_ptr + b * width + pos * PS + offs_t, tl.full([PS], float("-inf"), tl.float32))


@triton.jit
def _radix_select_kernel(
    scores_ptr, seq_lens_ptr, block_table_ptr, out_ptr,
    max_pages, num_pages, s_bt,
    PS: tl.constexpr, TOPK: tl.constexpr, BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    width = max_pages * PS
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b), width)  # a seq_len past the table counts its pages
    offs = tl.arange(0, BLOCK)
    page = tl.load(block_table_ptr + b * s_bt + offs // PS, mask=offs < seq_len, other=-1)
    valid = (offs < seq_len) & (page >= 0) & (page < num_pages)  # the reference's padding rule
    n_valid = tl.sum(valid.to(tl.int32), axis=0)
    if n_valid <= TOPK:  # every valid token is selected, in token order: no scores needed
        selected = valid
        slot = tl.cumsum(valid.to(tl.int32), axis=0) - 1
    else:
        s = tl.load(scores_ptr + b * width + offs, mask=valid, other=0.0)
        # Order-preserving int32 key (flip the magnitude bits of negatives); `ukey` = key with the
        # sign bit flipped orders the same as unsigned, so its bytes are radix digits, MSB first.
        sign = tl.full([], -2147483648, tl.int32)
        bits = s.to(tl.int32, bitcast=True)
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        ukey = key ^ sign
        need = tl.minimum(n_valid, TOPK)  # keys still to take among those matching the prefix
        n_match = n_valid  # keys matching the prefix (all valid ones before the first pass)
        prefix = tl.zeros([], dtype=tl.int32)
        prefix_mask = tl.zeros([], dtype=tl.int32)
        digits = tl.arange(0, 256)
        for shift in tl.static_range(24, -1, -8):
            match = valid & ((ukey & prefix_mask) == prefix)
            hist = tl.histogram(tl.where(match, (ukey >> shift) & 255, 0), 256)
            hist -= tl.where(digits == 0, BLOCK - n_match, 0)  # the non-matching keys went to bin 0
            at_least = n_match - tl.cumsum(hist, axis=0) + hist  # matching keys with digit >= d
            chosen = tl.maximum(tl.sum((at_least >= need).to(tl.int32), axis=0) - 1, 0)  # largest such d
            in_chosen = tl.where(digits == chosen, hist, 0)
            need -= tl.sum(tl.where(digits == chosen, at_least, 0) - in_chosen, axis=0)  # taken above it
            n_match = tl.sum(in_chosen, axis=0)
            prefix |= chosen << shift
            prefix_mask |= tl.full([], 255, tl.int32) << shift
        threshold = prefix ^ sign  # the k-th largest key
        # One scan ranks both kinds: keys above the threshold in the low 16 bits, equal keys in
        # the high 16 (rows hold at most RADIX_MAX_WIDTH < 2^16 keys).
        above = (valid & (key > threshold)).to(tl.int32)
        equal = (valid & (key == threshold)).to(tl.int32)
        ranks = tl.cumsum(above | (equal << 16), axis=0)  # inclusive
        above_before = (ranks & 0xFFFF) - above
        equal_before = (ranks >> 16) - equal
        selected = (above == 1) | ((equal == 1) & (equal_before < need))
        slot = above_before + tl.minimum(equal_before, need)
    tl.store(out_ptr + b * TOPK + slot, page * PS + offs % PS, mask=selected & (slot < TOPK))
    n_out = tl.minimum(n_valid, TOPK)
    pad = tl.arange(0, TOPK)
    tl.store(out_ptr + b * TOPK + pad, tl.full([TOPK], -1, tl.int32), mask=pad >= n_out)


def score_pages(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, *, skip_short=False,
                dot_fp32=None, pages=None):
    """fp32 scores [B, max_num_pages * 64]; slots at or past seq_len are unspecified, and so are all
    of a row with seq_len <= 2048 when skip_short is set. `pages` (pages per program) overrides
    the default of one page per program (benchmarks)."""
    batch, heads, dim = q_index_fp8.shape
    num_pages = k_index_cache_fp8.shape[0]
    max_pages = block_table.shape[1]
    if (heads, dim) != (HEADS, HEAD_DIM) or tuple(k_index_cache_fp8.shape[1:]) != (PAGE_SIZE, 1, HEAD_DIM + 4):
        raise ValueError("expected q [B, 64, 128] and a [num_pages, 64, 1, 132] key cache")
    if dot_fp32 is None:
        dot_fp32 = q_index_fp8.device.type != "cuda"
    scores = torch.empty(batch, max_pages * PAGE_SIZE, dtype=torch.float32, device=q_index_fp8.device)
    if batch == 0 or max_pages == 0:
        return scores
    cache = k_index_cache_fp8.contiguous().view(num_pages, PAGE_BYTES)
    # One page per program: on an H100 (benchmarks/dsa.py --sweep indexer, 2026-11-23) 1 page beat 2, 4
    # and 8 on every scored contest shape (B=27 x 82 pages: 7.3 us against 14.8 for 8), the queries
    # being re-read from L2 by each program costs less than the serial pages. With the dot's operands
    # swapped (tokens as rows), 2 pages a program (software-pipelined) won only at B=30 x 91 (6.45
    # against 6.88 us) and lost elsewhere (B=4 x 34: 3.55 against 2.84).
    pages = pages or 1
    _score_pages_kernel[(batch, triton.cdiv(max_pages, pages))](
        q_index_fp8.contiguous(), cache.view(torch.float8_e4m3fn), cache.view(torch.float32),
        weights.contiguous(), seq_lens, block_table, scores, max_pages, num_pages, block_table.stride(0),
        H=HEADS, D=HEAD_DIM, PS=PAGE_SIZE, PAGES=pages, SKIP_SHORT=skip_short, TOPK=TOPK,
        DOT_FP32=bool(dot_fp32), num_warps=4,
    )
    return scores


def indexer_radix(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, *, select_warps=None,
                  dot_fp32=None):
    batch, max_pages = block_table.shape
    if max_pages * PAGE_SIZE > RADIX_MAX_WIDTH:
        raise ValueError(f"radix select holds rows of at most {RADIX_MAX_WIDTH} tokens")
    scores = score_pages(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, skip_short=True,
                         dot_fp32=dot_fp32)
    out = torch.empty(batch, TOPK, dtype=torch.int32, device=block_table.device)
    if batch == 0:
        return out
    if max_pages == 0:
        return out.fill_(-1)
    block = max(triton.next_power_of_2(max_pages * PAGE_SIZE), TOPK)
    _radix_select_kernel[(batch,)](scores, seq_lens, block_table, out, max_pages, k_index_cache_fp8.shape[0],
                                   block_table.stride(0),
                                   PS=PAGE_SIZE, TOPK=TOPK, BLOCK=block,
                                   num_warps=select_warps or (8 if block <= 4096 else 16))
    return out


def torch_topk_ids(scores, seq_lens, block_table, num_pages: int, out):
    """out[:, :k] <- global ids (page * 64 + slot) of the k = min(2048, width) best tokens of each row
    of scores [B, width] (any row stride), best first, -1 for tokens past seq_len or on a page id
    outside [0, num_pages), whatever their score (garbage there is fine); returns out."""
    width = block_table.shape[1] * PAGE_SIZE
    slot = torch.arange(width, device=scores.device)
    table = block_table.repeat_interleave(PAGE_SIZE, dim=1)  # [B, width]
    valid = (slot[None, :] < seq_lens[:, None]) & (table >= 0) & (table < num_pages)
    scores = scores.masked_fill(~valid, float("-inf"))
    k = min(TOPK, width)
    best = torch.topk(scores, k, dim=1).indices  # [B, k]
    ids = torch.gather(table, 1, best) * PAGE_SIZE + (best % PAGE_SIZE).to(torch.int32)
    out[:, :k] = torch.where(torch.gather(valid, 1, best), ids, -1)
    return out


def indexer_torch_topk(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, *, dot_fp32=None):
    batch, max_pages = block_table.shape
    out = torch.full((batch, TOPK), -1, dtype=torch.int32, device=block_table.device)
    if batch == 0 or max_pages == 0:
        return out
    scores = score_pages(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table, dot_fp32=dot_fp32)
    return torch_topk_ids(scores, seq_lens, block_table, k_index_cache_fp8.shape[0], out)


@variant("dsa_topk_indexer", "triton_fp8_radix", backend="triton", archs=("sm90",), requires=("triton",),
         supports=lambda f: None if f["max_num_pages"] * PAGE_SIZE <= RADIX_MAX_WIDTH else
         f"rows over {RADIX_MAX_WIDTH} tokens ({RADIX_MAX_WIDTH // PAGE_SIZE} pages)")
def dsa_indexer_triton_radix(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    return indexer_radix(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)


@variant("dsa_topk_indexer", "triton_fp8_torch_topk", backend="triton", archs=("sm90",), requires=("triton",))
def dsa_indexer_triton_torch_topk(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    return indexer_torch_topk(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)
