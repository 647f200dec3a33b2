"""DeepSeek-V3.2 sparse attention (DSA) over a paged cache: the top-k indexer and the sparse MLA
attention, the specs of the definitions in this folder.

Inputs as served:
- indexer: every sequence has 1 .. max_num_pages * page_size tokens and the longest reaches the
  last block-table column; block-table pages are distinct across the batch (padding columns hold
  further distinct pages while the pool lasts, then any valid page); the FP8 key cache is real
  per-token quantisation (scale = amax / 448) in the deep_gemm page layout (`quantize_index_keys`);
  queries are quantised per (token, head) and that scale is folded into `weights`, as SGLang does.
- sparse attention: each row of `sparse_indices` is the top-k selection of one sequence: distinct
  real token ids page * page_size + slot of that sequence's (distinct) pages, in score (= random)
  order; a sequence shorter than topk selects all its tokens and pads the tail with -1. At least one
  row is such a short one when num_tokens >= 2.
The cache pools depend on (num_pages, seed), not on the workload, like the one KV pool a serving
engine keeps across batches (`workloads.Context.pooled`).
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import torch

from kdispatch import workloads
from kdispatch.checks import INCORRECT_NUMERICAL, PASSED, Tol, Verdict, combine, compare, first_bad
from kdispatch.spec import Coverage, Derived, Floor, Rotation, Spec

MAX_CONTEXT = 131072  # DeepSeek-V3.2 context length: longest sequence a sparse_indices row comes from
# The coverage sets' cache pool: 16384 pages (1M tokens), or the indexer batch's own pages when more
# (every sequence on distinct pages, as in an engine's pool).
COVERAGE_POOL_PAGES = 16384


# ----------------------------------------------------------------------------------------------
# FP8 index keys in the deep_gemm page layout
# ----------------------------------------------------------------------------------------------

def quantize_index_keys(keys: torch.Tensor) -> torch.Tensor:
    """[P, page, D] float keys -> [P, page, 1, D + 4] int8 FP8 cache in the deep_gemm page layout.

    Per page: page * D e4m3 bytes (token-major), then `page` little-endian float32 scales; token t's
    scale is amax(|key_t|) / 448, so every key uses the full FP8 range."""
    return _pack_index_keys(keys.to(torch.float32).clone())


def _pack_index_keys(k: torch.Tensor) -> torch.Tensor:
    """`quantize_index_keys` of a float32 tensor it may overwrite."""
    pages, page_size, dim = k.shape
    scale = (workloads.amax_last(k) / workloads.FP8_MAX).clamp_min(1e-12)  # [P, page]
    q = workloads.to_fp8(k, (1.0 / scale)[..., None])
    out = torch.empty(pages, page_size * (dim + 4), dtype=torch.uint8)
    out[:, : page_size * dim] = q.view(torch.uint8).reshape(pages, page_size * dim)
    out[:, page_size * dim:] = scale.contiguous().view(torch.uint8).reshape(pages, page_size * 4)
    return out.view(torch.int8).view(pages, page_size, 1, dim + 4)


def dequantize_index_cache(cache: torch.Tensor) -> torch.Tensor:
    """Inverse of `quantize_index_keys`: [P, page, 1, D + 4] int8 -> [P, page, D] float32 keys."""
    pages, page_size, _, width = cache.shape
    dim = width - 4
    raw = cache.contiguous().view(torch.uint8).reshape(pages, page_size * width)
    vals = raw[:, : page_size * dim].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    scale = raw[:, page_size * dim:].contiguous().view(torch.float32)  # [P, page]
    return vals.view(pages, page_size, dim) * scale[..., None]


# ----------------------------------------------------------------------------------------------
# Indexer inputs
# ----------------------------------------------------------------------------------------------

def _index_seq_lens(batch: int, max_pages: int, num_pages: int, page: int, g: torch.Generator) -> torch.Tensor:
    """[B] int32: 1 .. max_pages * page tokens each, the longest on the last block-table page;
    capped so that the used pages fit the pool distinctly."""
    if batch == 0:
        return torch.zeros(0, dtype=torch.int32)
    if max_pages == 0:
        return torch.zeros(batch, dtype=torch.int32)
    if num_pages < max_pages + batch - 1:
        raise ValueError(f"a pool of {num_pages} pages cannot hold {batch} sequences with distinct pages "
                         f"when the longest needs {max_pages}")
    width = max_pages * page
    lens = torch.randint(1, width + 1, (batch,), generator=g)
    longest = int(torch.randint(0, batch, (1,), generator=g))
    lens[longest] = int(torch.randint(width - page + 1, width + 1, (1,), generator=g))
    pages = (lens + page - 1) // page
    if int(pages.sum()) > num_pages:  # only for tiny synthetic pools: shrink the others' page counts
        others = torch.ones(batch, dtype=torch.bool)
        others[longest] = False
        budget = num_pages - max_pages
        cap = max_pages
        while int(pages[others].clamp(max=cap).sum()) > budget:
            cap -= 1
        lens[others] = lens[others].clamp(max=cap * page)
    return lens.to(torch.int32)


def _index_block_table(seq_lens: torch.Tensor, max_pages: int, num_pages: int, page: int,
                       g: torch.Generator) -> torch.Tensor:
    """[B, max_pages] int32 of pool pages: a sequence's used pages are distinct across the batch;
    the unused columns get further distinct pages while the pool lasts, then random valid ones."""
    batch = seq_lens.shape[0]
    if batch * max_pages == 0:
        return torch.zeros(batch, max_pages, dtype=torch.int32)
    perm = torch.randperm(num_pages, generator=g)
    if batch * max_pages <= num_pages:
        return perm[: batch * max_pages].view(batch, max_pages).to(torch.int32)
    used = ((seq_lens.to(torch.long) + page - 1) // page).clamp(max=max_pages)
    is_used = torch.arange(max_pages)[None, :] < used[:, None]  # [B, max_pages]
    n_used = int(is_used.sum())
    if n_used > num_pages:
        raise ValueError(f"sequences use {n_used} pages, more than the pool of {num_pages}")
    table = torch.randint(0, num_pages, (batch, max_pages), generator=g)
    table[is_used] = perm[:n_used]
    return table.to(torch.int32)


def build_indexer(axes, given, ctx) -> dict:
    b, p, n = axes["batch_size"], axes["max_num_pages"], axes["num_pages"]
    heads, dim, page = axes["num_index_heads"], axes["index_head_dim"], axes["page_size"]
    out = {}
    seq_lens = given.get("seq_lens")
    if seq_lens is None:
        seq_lens = out["seq_lens"] = _index_seq_lens(b, p, n, page, ctx.rng("seq_lens"))
    if "block_table" not in given:
        out["block_table"] = _index_block_table(seq_lens, p, n, page, ctx.rng("block_table"))
    if "q_index_fp8" not in given or "weights" not in given:
        # SGLang: q quantised per (token, head); weights = weights_proj(x) * H^-0.5 * q_scale * D^-0.5.
        g = ctx.rng("q_index")
        q, q_scale = workloads.quantize_rows_blocked(workloads.randn(b * heads, dim, generator=g), block=dim)
        out["q_index_fp8"] = q.view(b, heads, dim)
        proj = workloads.randn(b, heads, generator=g)
        out["weights"] = proj * heads ** -0.5 * q_scale.view(b, heads) * dim ** -0.5
    if "k_index_cache_fp8" not in given:
        def build(g):  # N(0, 1) keys (LayerNorm'd + rope in the model), 1024 pages at a time
            cache = torch.empty(n, page, 1, dim + 4, dtype=torch.int8)
            for lo in range(0, n, 1024):
                hi = min(lo + 1024, n)
                cache[lo:hi] = _pack_index_keys(workloads.randn(hi - lo, page, dim, generator=g))
            return cache
        out["k_index_cache_fp8"] = ctx.pooled("k_index_cache_fp8", (n,), build)
    return out


# ----------------------------------------------------------------------------------------------
# Indexer check: reachability, no duplicates, sorted-score comparison (ties pass)
# ----------------------------------------------------------------------------------------------

def indexer_scores(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    """The reference's scoring of every cached token of every sequence.

    Returns (scores [B, W] float32, -inf at padding; token_ids [B, W] int64, the global id
    page * page_size + slot of position j, -1 at padding), W = max_num_pages * page_size. Padding:
    past a sequence's end, and the tokens of a page id outside [0, num_pages) (the reference's rule)."""
    batch, _, dim = q_index_fp8.shape
    num_pages, page = k_index_cache_fp8.shape[:2]
    max_pages = block_table.shape[1]
    width = max_pages * page
    device = q_index_fp8.device
    lens = seq_lens.to(device=device, dtype=torch.long)
    if batch == 0 or width == 0 or num_pages == 0:
        return (torch.full((batch, width), float("-inf"), device=device),
                torch.full((batch, width), -1, dtype=torch.long, device=device))
    table = block_table.to(device=device, dtype=torch.long)
    page_ok = (torch.arange(max_pages, device=device)[None, :] * page < lens[:, None]) & (table >= 0) & (table < num_pages)
    pages = torch.where(page_ok, table, 0)
    keys = dequantize_index_cache(k_index_cache_fp8[pages.reshape(-1)]).view(batch, width, dim)
    logits = torch.matmul(q_index_fp8.to(torch.float32), keys.transpose(1, 2))  # [B, H, W]
    scores = (torch.relu(logits) * weights.to(torch.float32)[:, :, None]).sum(dim=1)
    pos = torch.arange(width, device=device)
    valid = (pos[None, :] < lens[:, None]) & page_ok.repeat_interleave(page, dim=1)
    scores = scores.masked_fill(~valid, float("-inf"))
    token_ids = torch.gather(pages, 1, (pos // page)[None, :].expand(batch, -1)) * page + pos % page
    return scores, torch.where(valid, token_ids, torch.full_like(token_ids, -1))


def _indexer_reference_extra(args: dict) -> dict:
    scores, token_ids = indexer_scores(args["q_index_fp8"], args["k_index_cache_fp8"], args["weights"],
                                       args["seq_lens"], args["block_table"])
    return {"scores": scores, "token_ids": token_ids}


def check_indexer_values(args: dict) -> tuple[str, str] | None:
    """The checked mode's rules: seq_lens in [0, max_num_pages * 64]; the block-table entries a
    sequence reaches are pages of the cache."""
    seq_lens, table = args["seq_lens"], args["block_table"]
    num_pages, page = args["k_index_cache_fp8"].shape[:2]
    width = table.shape[1] * page
    at = first_bad((seq_lens < 0) | (seq_lens > width))
    if at is not None:
        return "seq_lens", f"seq_lens[{at[0]}] = {int(seq_lens[at])} is outside [0, max_num_pages * {page} = {width}]"
    reached = torch.arange(table.shape[1], device=table.device)[None, :] * page < seq_lens[:, None]
    at = first_bad(reached & ((table < 0) | (table >= num_pages)))
    if at is not None:
        return "block_table", f"block_table[{at[0]}, {at[1]}] = {int(table[at])} is not a page id in [0, {num_pages})"
    return None


def _rows(mask: torch.Tensor) -> list[int]:
    return sorted({int(r) for r in torch.nonzero(mask)[:, 0].tolist()})[:5]


def check_indexer(args: dict, out: dict, ref: dict, extra: dict) -> Verdict:
    """Per row: the first min(topk, n) entries (n: the row's valid tokens, see `indexer_scores`) are
    distinct token ids reachable through the row's block table, the rest -1, and their reference
    scores sorted descending equal the reference's top scores (atol as a fraction of the row's
    largest score: scores have no unit)."""
    idx = out["topk_indices"]
    scores, token_ids = extra["scores"], extra["token_ids"]
    tol = SPECS["dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"].tolerance("topk_indices")
    batch, k = idx.shape
    width = scores.shape[1]
    device = idx.device
    n = (token_ids >= 0).sum(dim=1).to(device).clamp(max=k)  # entries that must be token ids, per row
    slot = torch.arange(k, device=device)
    want = slot[None, :] < n[:, None]
    ids = idx.to(torch.long)
    if bool((ids[~want] != -1).any()):
        return Verdict(INCORRECT_NUMERICAL, f"rows {_rows((ids != -1) & ~want)}: entries after the first "
                                            "min(topk, valid tokens) must be -1", metrics={"padding_ok": False})
    if bool((ids[want] < 0).any()):
        return Verdict(INCORRECT_NUMERICAL, f"rows {_rows((ids < 0) & want)}: fewer than min(topk, valid tokens) indices",
                       metrics={"count_ok": False})
    if width == 0 or batch == 0:
        return Verdict(PASSED, "", 0.0, 0.0, {})
    # Reachability: every selected id is a token of that row's sequence.
    big = torch.iinfo(torch.long).max
    sorted_ids, perm = torch.where(token_ids >= 0, token_ids, torch.full_like(token_ids, big)).sort(dim=1)
    q = torch.where(want, ids, torch.zeros_like(ids))
    loc = torch.searchsorted(sorted_ids, q.contiguous()).clamp(max=width - 1)
    found = sorted_ids.gather(1, loc) == q
    if bool((~found & want).any()):
        return Verdict(INCORRECT_NUMERICAL, f"rows {_rows(~found & want)}: an index is not a token of its sequence "
                                            "(unreachable)", metrics={"reachable": False})
    # No duplicates (padding replaced by distinct negative sentinels).
    uniq = torch.where(want, ids, -(slot[None, :] + 2).expand(batch, -1)).sort(dim=1).values
    if bool((uniq[:, 1:] == uniq[:, :-1]).any()):
        return Verdict(INCORRECT_NUMERICAL, f"rows {_rows(uniq[:, 1:] == uniq[:, :-1])}: duplicate indices",
                       metrics={"duplicates": True})
    # Sorted-score comparison: the selected tokens' reference scores vs the reference's top scores.
    pos = perm.gather(1, loc)
    got = torch.where(want, scores.gather(1, pos), torch.full_like(scores[:, :1].expand(-1, k), float("-inf")))
    got = got.sort(dim=1, descending=True).values
    kk = min(k, width)
    top = scores.topk(kk, dim=1).values
    if kk < k:
        top = torch.cat([top, torch.full((batch, k - kk), float("-inf"), device=device)], dim=1)
    row_max = torch.where(want, top.abs(), torch.zeros_like(top)).amax(dim=1, keepdim=True).clamp_min(1e-30)
    err = torch.where(want, (got - top).abs(), torch.zeros_like(top))
    exceed = want & (err > tol.atol * row_max) & (err > tol.rtol * top.abs())
    max_abs = float(err.max()) if err.numel() else 0.0
    max_rel = float((err / row_max).max()) if err.numel() else 0.0
    metrics = {"score.max_abs": max_abs, "score.max_rel_to_row_max": max_rel}
    if bool(exceed.any()):
        return Verdict(INCORRECT_NUMERICAL, f"rows {_rows(exceed)}: selected tokens' sorted scores differ from the "
                                            f"reference's top scores (max err {max_rel:.3g} of the row max)",
                       max_abs, max_rel, metrics)
    return Verdict(PASSED, "", max_abs, max_rel, metrics)


def _shift_pages(args: dict, i: int, n: int, pool: str) -> int:
    """Set i's page shift: i * num_pages / n, so set i reads other pages of the same pool."""
    return i * max(1, args[pool].shape[0] // n)


def _rotate_block_table(args: dict, i: int, n: int) -> torch.Tensor:
    x = args["block_table"]
    num_pages = args["k_index_cache_fp8"].shape[0]
    return ((x.to(torch.long) + _shift_pages(args, i, n, "k_index_cache_fp8")) % num_pages).to(x.dtype)


def _indexer_set_bytes(args: dict) -> int:
    cache = args["k_index_cache_fp8"]
    page = cache.shape[1]
    pages = int(((args["seq_lens"].to(torch.long) + page - 1) // page).sum())
    return pages * page * cache.shape[3]


def indexer_floor(args: dict, axes: dict) -> Floor:
    """The referenced pages' keys and scales, the queries and weights, the output."""
    return Floor(_indexer_set_bytes(args) + args["q_index_fp8"].numel() + args["weights"].numel() * 4
                 + axes["batch_size"] * axes["topk"] * 4)


# ----------------------------------------------------------------------------------------------
# Sparse attention
# ----------------------------------------------------------------------------------------------

def random_sparse_indices(num_tokens: int, num_pages: int, page: int, topk: int, g: torch.Generator
                          ) -> torch.Tensor:
    """[num_tokens, topk] int32: row t is the top-k of a sequence of L_t tokens on distinct random
    pages: min(L_t, topk) distinct token ids page * `page` + slot in random (score) order, -1 after.

    L_t is log-uniform in [topk, min(pool, 131072)] (a full row), or for a quarter of the rows, and
    for at least one row when num_tokens >= 2, uniform in [1, topk - 1] (a -1 padded tail)."""
    pool = num_pages * page
    out = torch.full((num_tokens, topk), -1, dtype=torch.int32)
    if num_tokens == 0 or pool == 0:
        return out
    short = torch.rand(num_tokens, generator=g) < 0.25
    if num_tokens >= 2 and not bool(short.any()):
        short[int(torch.randint(0, num_tokens, (1,), generator=g))] = True
    long_hi = min(pool, MAX_CONTEXT)
    us = torch.rand(num_tokens, generator=g).tolist()
    # each row from its own generator, the rows on torch's threads at once (two permutations of up to
    # 131k a row: 3.4 s for 8,192 rows on one core); the bytes do not depend on the thread count
    seeds = torch.randint(0, 1 << 62, (num_tokens,), generator=g).tolist()
    is_short = short.tolist()

    def row(t: int) -> None:
        u, rg = us[t], torch.Generator().manual_seed(seeds[t])
        if is_short[t] or pool < topk:  # a pool under topk tokens holds only short sequences
            short_hi = min(pool, topk - 1)
            length = min(1 + int(u * short_hi), short_hi)
        else:
            length = int(round(math.exp(math.log(topk) + u * (math.log(long_hi) - math.log(topk)))))
            length = max(topk, min(length, long_hi))
        pages = torch.randperm(num_pages, generator=rg)[: (length + page - 1) // page]
        n_valid = min(length, topk)
        pos = torch.randperm(length, generator=rg)[:n_valid]
        out[t, :n_valid] = (pages[pos // page] * page + pos % page).to(torch.int32)

    with ThreadPoolExecutor(max(1, min(torch.get_num_threads(), num_tokens))) as threads:
        list(threads.map(row, range(num_tokens)))
    return out


def build_sparse_attention(axes, given, ctx) -> dict:
    t, n, h = axes["num_tokens"], axes["num_pages"], axes["num_qo_heads"]
    ckv, kpe, ps = axes["head_dim_ckv"], axes["head_dim_kpe"], axes["page_size"]
    bf16 = torch.bfloat16
    out = {}
    # q . k has 576 terms of N(0,1) x N(0,1): logits ~ N(0, 576/192 = 3), a moderately peaked softmax.
    if "q_nope" not in given:
        out["q_nope"] = workloads.randn(t, h, ckv, generator=ctx.rng("q_nope"), dtype=bf16)
    if "q_pe" not in given:
        out["q_pe"] = workloads.randn(t, h, kpe, generator=ctx.rng("q_pe"), dtype=bf16)
    if "ckv_cache" not in given:
        out["ckv_cache"] = ctx.pooled("ckv_cache", (n,), lambda g: workloads.randn(n, ps, ckv, generator=g, dtype=bf16))
    if "kpe_cache" not in given:
        out["kpe_cache"] = ctx.pooled("kpe_cache", (n,), lambda g: workloads.randn(n, ps, kpe, generator=g, dtype=bf16))
    if "sparse_indices" not in given:
        out["sparse_indices"] = random_sparse_indices(t, n, ps, axes["topk"], ctx.rng("sparse_indices"))
    return out


def check_sparse_attention_values(args: dict) -> tuple[str, str] | None:
    """The checked mode's rule: every index is -1 or a token of the cache."""
    idx = args["sparse_indices"]
    tokens = args["ckv_cache"].shape[0] * args["ckv_cache"].shape[1]
    at = first_bad((idx != -1) & ((idx < 0) | (idx >= tokens)))
    if at is not None:
        return "sparse_indices", f"sparse_indices[{at[0]}, {at[1]}] = {int(idx[at])} is neither -1 nor in [0, {tokens})"
    return None


def check_sparse_attention(args: dict, out: dict, ref: dict, extra: dict) -> Verdict:
    """Output and base-2 lse elementwise; a row without any valid index must give exactly zeros
    and lse = -inf, and a row with valid indices a finite lse."""
    output, lse = out["output"], out["lse"]
    empty = torch.isneginf(ref["lse"])  # [T, H]: rows without any valid index
    if bool(empty.any()):
        if not bool(torch.isneginf(lse[empty]).all()):
            return Verdict(INCORRECT_NUMERICAL, "lse: a row without valid indices must be -inf",
                           float("inf"), float("inf"))
        if not bool((output[empty].float() == 0).all()):
            return Verdict(INCORRECT_NUMERICAL, "output: a row without valid indices must be zeros",
                           float("inf"), float("inf"))
    if bool(torch.isneginf(lse[~empty]).any()):
        return Verdict(INCORRECT_NUMERICAL, "lse: -inf for a row with valid indices", float("inf"), float("inf"))
    spec = SPECS["dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"]
    return combine([compare(n, out[n], ref[n], spec.tolerance(n)) for n in ("output", "lse")])


def _rotate_sparse_indices(args: dict, i: int, n: int) -> torch.Tensor:
    x = args["sparse_indices"]
    num_pages, page = args["ckv_cache"].shape[:2]
    xl = x.to(torch.long)
    moved = ((xl // page + _shift_pages(args, i, n, "ckv_cache")) % num_pages) * page + xl % page
    return torch.where(xl >= 0, moved, xl).to(x.dtype)


def _sparse_row_bytes(args: dict) -> int:
    return (args["ckv_cache"].shape[-1] + args["kpe_cache"].shape[-1]) * args["ckv_cache"].element_size()


def _sparse_set_bytes(args: dict) -> int:
    return int((args["sparse_indices"] >= 0).sum()) * _sparse_row_bytes(args)


def sparse_attention_floor(args: dict, axes: dict) -> Floor:
    """The selected cache rows, the queries, the output and lse."""
    t, h, dc = args["q_nope"].shape
    q_bytes = (args["q_nope"].numel() + args["q_pe"].numel()) * 2
    return Floor(_sparse_set_bytes(args) + q_bytes + t * h * (dc * 2 + 4))


SPECS = {
    "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64": Spec(
        short="dsa_topk_indexer", family="dsa", build=build_indexer, reference="kdispatch.references.dsa_topk_indexer",
        fit=("kv_fits_topk", "batch_size", "max_num_pages", "kv_pages"), main="max_num_pages",
        # num_pages is the pool size: it does not change what a kernel costs.
        derived={
            "kv_fits_topk": Derived("max_num_pages * page_size <= topk",
                                    "every cached token is selected (no top-k needed, -1 padding)", is_bool=True),
            "kv_pages": Derived("batch_size * max_num_pages", "block-table entries of the batch (work)"),
        },
        shared=frozenset({"k_index_cache_fp8"}),
        tolerances={"topk_indices": Tol(1e-2, 1e-2)},  # on the selected scores, atol relative to the row max
        check=check_indexer, reference_extra=_indexer_reference_extra,
        rotation=Rotation("block_table", _rotate_block_table, _indexer_set_bytes),
        floor=indexer_floor, check_values=check_indexer_values,
        coverage=Coverage({"batch_size": (1, 128), "max_num_pages": (1, 2048)}, points=30, heldout=20,
                          complete=lambda a: {**a, "num_pages": max(COVERAGE_POOL_PAGES,
                                                                    a["batch_size"] * a["max_num_pages"])})),
    "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64": Spec(
        short="dsa_sparse_attention", family="dsa", build=build_sparse_attention,
        reference="kdispatch.references.dsa_sparse_attention",
        fit=("num_tokens",), main="num_tokens",
        model_scalars={
            # The official definition's value, 1/sqrt(qk_nope 128 + rope 64). (DeepSeek-V3.2 itself also
            # multiplies by the YaRN mscale^2 = (0.1 ln 40 + 1)^2 ~ 1.87; the contest keeps the plain value.)
            "sm_scale": 1.0 / math.sqrt(192)},
        shared=frozenset({"ckv_cache", "kpe_cache"}),
        strided=frozenset({"q_nope", "q_pe"}),  # engines slice both out of one [T, 16, 576] query
        tolerances={"output": Tol(1e-2, 1e-2), "lse": Tol(1e-2, 1e-2)},
        check=check_sparse_attention,
        rotation=Rotation("sparse_indices", _rotate_sparse_indices, _sparse_set_bytes),
        floor=sparse_attention_floor, check_values=check_sparse_attention_values,
        coverage=Coverage({"num_tokens": (1, 8192)}, points=32, heldout=10,
                          complete=lambda a: {**a, "num_pages": COVERAGE_POOL_PAGES})),
}
