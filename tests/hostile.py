"""Hostile index inputs for the definitions whose tensors carry indices, shared by the CPU
tests (tests/test_hostile_input.py), the GPU tests (tests/gpu/test_hostile_gpu.py) and the sanitizer
script (tests/gpu/sanitize.py).

`hostile(short, args, seed)` returns the call's arguments with its index tensors corrupted: random
int32 values at the edges (negative, -1, just past the end, INT32_MAX / MIN) in a seeded fraction
of the entries of a block table, sparse-index table, seq_lens or pool slot indices, or one kind of malformed
cu_seqlens per seed. The kernels must treat them as each definition's JSON says (padding, or a
whole-batch no-op for cu_seqlens): the gate compares every variant with the reference on them.
"""
from __future__ import annotations

import torch

from kdispatch import definitions

HEADS = ((16, 32), (8, 16), (4, 8), (2, 4))  # the engine-convention definitions' (q/k, v) heads
PACKED = tuple(f"gdn_decode_packed_qk{hq}_v{hv}" for hq, hv in HEADS)
POOL_PREFILL = tuple(f"gdn_prefill_pool_qk{hq}_v{hv}" for hq, hv in HEADS)
GATHERED_PREFILL = tuple(f"gdn_prefill_gathered_qk{hq}_v{hv}" for hq, hv in HEADS)  # boundaries only
VERIFY = tuple(f"gdn_verify_qk{hq}_v{hv}" for hq, hv in HEADS)
VERIFY_STEPS = tuple(f"gdn_verify_steps_qk{hq}_v{hv}" for hq, hv in HEADS)
INDEXED = ("dsa_topk_indexer", "dsa_sparse_attention", "gdn_prefill", *PACKED, *POOL_PREFILL, *GATHERED_PREFILL,
           *VERIFY, *VERIFY_STEPS)
WITH_CU = ("gdn_prefill", *POOL_PREFILL, *GATHERED_PREFILL, *VERIFY, *VERIFY_STEPS)  # one malformed cu_seqlens kind per seed
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
MALFORMED_CU = ("valid", "start", "decreasing", "short_end", "long_end", "negative", "huge")


def _edge_values(limit: int) -> torch.Tensor:
    return torch.tensor([INT32_MIN, INT32_MIN + 1, -65, -2, -1, limit, limit + 1, INT32_MAX], dtype=torch.int64)


def _corrupt(t: torch.Tensor, limit: int, g: torch.Generator, fraction: float) -> torch.Tensor:
    """`t` (int32) with about `fraction` of its entries replaced by edge values around [0, limit)."""
    cpu = t.cpu().to(torch.int64)
    hit = torch.rand(cpu.shape, generator=g) < fraction
    edges = _edge_values(limit)
    picks = edges[torch.randint(len(edges), cpu.shape, generator=g)]
    return torch.where(hit, picks, cpu).clamp(INT32_MIN, INT32_MAX).to(torch.int32).to(t.device)


def malformed_cu(cu: torch.Tensor, total: int, kind: str) -> torch.Tensor:
    c = cu.cpu().clone()
    n = c.shape[0] - 1
    if kind == "start":
        c[0] = 1
    elif kind == "decreasing" and n >= 2:
        c[1] = c[2] + 1
    elif kind == "decreasing":
        c[-1] = -1
    elif kind == "short_end":
        c[-1] = total - 1
    elif kind == "long_end":
        c[-1] = total + 7
    elif kind == "negative":
        c[n // 2] = -5
    elif kind == "huge":
        c[-1] = 2**62 if c.dtype == torch.int64 else INT32_MAX
    return c.to(cu.device)


def hostile(short: str, args, seed: int) -> list:
    d = definitions.get(short)
    a = dict(zip(d.inputs, args))
    g = torch.Generator().manual_seed(seed)
    if d.short == "dsa_topk_indexer":
        num_pages, page = a["k_index_cache_fp8"].shape[:2]
        width = a["block_table"].shape[1] * page
        a["block_table"] = _corrupt(a["block_table"], num_pages, g, 0.3)
        a["seq_lens"] = _corrupt(a["seq_lens"], width, g, 0.3)
    elif d.short == "dsa_sparse_attention":
        tokens = a["ckv_cache"].shape[0] * a["ckv_cache"].shape[1]
        a["sparse_indices"] = _corrupt(a["sparse_indices"], tokens, g, 0.3)
    elif d.short == "gdn_prefill" or d.short in GATHERED_PREFILL:
        a["cu_seqlens"] = malformed_cu(a["cu_seqlens"], a["q"].shape[0], MALFORMED_CU[seed % len(MALFORMED_CU)])
    elif d.short in PACKED:  # every corrupted slot is outside the pool: a padding row
        a["state_indices"] = _corrupt(a["state_indices"], a["state_pool"].shape[0], g, 0.3)
    elif d.short in POOL_PREFILL:  # corrupted slots (padding sequences) and one kind of boundaries per seed
        a["state_indices"] = _corrupt(a["state_indices"], a["state_pool"].shape[0], g, 0.3)
        a["cu_seqlens"] = malformed_cu(a["cu_seqlens"], a["q"].shape[0], MALFORMED_CU[seed % len(MALFORMED_CU)])
    elif d.short in VERIFY:  # slots (start from zeros), cache rows (store nothing), boundaries (even partition)
        a["state_indices"] = _corrupt(a["state_indices"], a["state_pool"].shape[0], g, 0.3)
        a["cache_indices"] = _corrupt(a["cache_indices"], a["intermediate_states"].shape[0], g, 0.3)
        a["cu_seqlens"] = malformed_cu(a["cu_seqlens"], a["q"].shape[0], MALFORMED_CU[seed % len(MALFORMED_CU)])
    elif d.short in VERIFY_STEPS:  # step slots (none), accepted counts (padding), boundaries (even partition)
        a["step_slots"] = _corrupt(a["step_slots"], a["state_pool"].shape[0], g, 0.3)
        a["num_accepted"] = _corrupt(a["num_accepted"], a["step_slots"].shape[1] + 1, g, 0.3)
        a["cu_seqlens"] = malformed_cu(a["cu_seqlens"], a["q"].shape[0], MALFORMED_CU[seed % len(MALFORMED_CU)])
    else:
        raise ValueError(f"{short} has no index inputs")
    return [a[n] for n in d.inputs]


def sparse_attention_shapes(num_pages: int) -> list[dict]:
    """One dsa_sparse_attention shape per kernel configuration that cuda_splitk's config() picks by
    token count (the first count of each), so a fuzz or sanitizer run reaches every compiled kernel."""
    from kdispatch.kernels.cuda.dsa.sparse_attention_splitk import MAX_CTAS, config

    first: dict = {}
    for tokens in range(1, MAX_CTAS + 1):  # past MAX_CTAS tokens the config no longer changes
        first.setdefault(config(tokens), tokens)
    return [{"num_tokens": t, "num_pages": num_pages} for t in first.values()]
