"""Gated DeltaNet (Qwen3-Next) decode and prefill: the specs of the definitions in this folder.

Inputs as served: q, k L2-normalised per head; the state a decayed sum of rank-1 writes (what a
real mid-sequence state looks like); A_log = log(U(1, 16)); dt_bias = softplus^-1 of a log-uniform
dt in [1e-3, 1e-1] (the Mamba-2 initialisation; with these the decays span (0, 1)); prefill
`cu_seqlens` splits `total_seq_len` into `num_seqs` non-empty sequences at random cut points.
The state is updated in place and returned as `new_state` (serving engines keep states in a pool).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from kdispatch import workloads
from kdispatch.checks import Tol, first_bad
from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, gathered_prefill_name
from kdispatch.definitions.gdn.names import PACKED_HEADS, packed_name, pool_prefill_name, verify_name, verify_steps_name
from kdispatch.spec import Coverage, Derived, Estimate, Floor, Hint, Rotation, Spec, log_steps


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def _state(n: int, heads: int, dim: int, g: torch.Generator) -> torch.Tensor:
    """[n, H, V, K] float32: sum_i 0.95^i v_i k_i^T over 64 past writes (unit k, N(0,1) v):
    entries ~0.3, S @ k recalls O(1) values, like a state in the middle of a sequence."""
    writes = 64
    k = _unit(workloads.randn(n, heads, writes, dim, generator=g))  # [n, H, r, K]
    v = workloads.randn(n, heads, dim, writes, generator=g)  # [n, H, V, r]
    w = 0.95 ** torch.arange(writes, dtype=torch.float32)
    return torch.matmul(v * w, k).contiguous()


def _gate_params(heads: int, ctx) -> dict:
    g = ctx.rng("gdn_params")
    a_log = torch.log(torch.empty(heads).uniform_(1.0, 16.0, generator=g))
    dt = torch.exp(torch.empty(heads).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
    dt_bias = dt + torch.log(-torch.expm1(-dt))  # softplus(dt_bias) == dt
    return {"A_log": a_log, "dt_bias": dt_bias}


def _build_common(lead: list[int], n_state: int, axes: dict, given: dict, ctx) -> dict:
    hq, hk, hv, d = axes["num_q_heads"], axes["num_k_heads"], axes["num_v_heads"], axes["head_size"]
    bf16 = torch.bfloat16
    out = {}
    if "q" not in given:
        out["q"] = _unit(workloads.randn(*lead, hq, d, generator=ctx.rng("q"))).to(bf16)
    if "k" not in given:
        out["k"] = _unit(workloads.randn(*lead, hk, d, generator=ctx.rng("k"))).to(bf16)
    if "v" not in given:
        out["v"] = workloads.randn(*lead, hv, d, generator=ctx.rng("v")).to(bf16)
    if "state" not in given:
        out["state"] = _state(n_state, hv, d, ctx.rng("state"))
    if "a" not in given:
        out["a"] = workloads.randn(*lead, hv, generator=ctx.rng("a")).to(bf16)
    if "b" not in given:
        out["b"] = workloads.randn(*lead, hv, generator=ctx.rng("b")).to(bf16)
    out.update(_gate_params(hv, ctx))
    return out


def build_decode(axes, given, ctx) -> dict:
    b = axes["batch_size"]
    return _build_common([b, axes["seq_len"]], b, axes, given, ctx)


def random_cu_seqlens(total: int, num_seqs: int, g: torch.Generator) -> torch.Tensor:
    """[num_seqs + 1] int64 boundaries splitting `total` tokens into non-empty sequences at
    uniformly random distinct cut points (lengths from 1 to most of `total`)."""
    if num_seqs == 0:
        if total:
            raise ValueError(f"{total} tokens cannot form 0 sequences")
        return torch.zeros(1, dtype=torch.int64)
    if num_seqs > total:
        raise ValueError(f"{total} tokens cannot form {num_seqs} non-empty sequences")
    cuts = torch.randperm(total - 1, generator=g)[: num_seqs - 1].sort().values + 1
    return torch.cat([torch.zeros(1, dtype=torch.int64), cuts.to(torch.int64),
                      torch.full((1,), total, dtype=torch.int64)])


def skewed_cu_seqlens(total: int, num_seqs: int, g: torch.Generator) -> torch.Tensor:
    """One long sequence (at a random position) among short ones: the short ones share an eighth of
    the tokens equally (at least one each), the long one takes the rest."""
    short = max(1, (total // 8) // max(num_seqs - 1, 1))
    lens = torch.full((num_seqs,), short, dtype=torch.int64)
    lens[int(torch.randint(0, num_seqs, (1,), generator=g))] = total - short * (num_seqs - 1)
    return torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])


def equal_cu_seqlens(total: int, num_seqs: int) -> torch.Tensor:
    """Sequences of equal length (the first total % num_seqs one token longer)."""
    lens = torch.full((num_seqs,), total // num_seqs, dtype=torch.int64)
    lens[: total % num_seqs] += 1
    return torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])


def prefill_mix(axes: dict, mix: str, g: torch.Generator) -> dict:
    """The coverage sets' sequence-length mixes: "random" cut points (the builder's), "skewed" and
    "equal" (stored with the workload)."""
    total, n = axes["total_seq_len"], axes["num_seqs"]
    if mix == "skewed":
        return {"cu_seqlens": skewed_cu_seqlens(total, n, g)}
    if mix == "equal":
        return {"cu_seqlens": equal_cu_seqlens(total, n)}
    return {}


def one_sequence(axes: dict) -> bool:
    """Coverage.one_mix of the prefills: one sequence is [0, T] in every length mix."""
    return axes["num_seqs"] == 1


def _prefill_cu_seqlens(axes: dict, given: dict, ctx) -> torch.Tensor:
    """The workload's boundaries: given, or at random cut points (seeded by the workload)."""
    if "cu_seqlens" in given:
        return given["cu_seqlens"]
    return random_cu_seqlens(axes["total_seq_len"], axes["num_seqs"], ctx.rng("cu_seqlens"))


def build_prefill(axes, given, ctx) -> dict:
    total, n = axes["total_seq_len"], axes["num_seqs"]
    out = _build_common([total], n, axes, given, ctx)
    if "cu_seqlens" not in given:
        out["cu_seqlens"] = _prefill_cu_seqlens(axes, given, ctx)
    return out


def longest_prefill(axes: dict, given: dict, ctx) -> int:
    """Tokens of the batch's longest sequence."""
    cu = _prefill_cu_seqlens(axes, given, ctx).to(torch.int64)
    return int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0


def _state_bytes(args: dict) -> int:
    return args["state"].numel() * args["state"].element_size()


# Timing: every set gets its own copy of the state (B x 512 KB), which is also what keeps timing
# from writing into the caller's state.
STATE_ROTATION = Rotation("state", lambda args, i, n: args["state"].clone(), _state_bytes)


def floor(args: dict, axes: dict) -> Floor:
    """State read + written once, q/k/v/a/b read and the output written once (bf16)."""
    moved = sum(args[n].numel() * args[n].element_size() for n in ("q", "k", "v", "a", "b"))
    return Floor(2 * _state_bytes(args) + moved + args["v"].numel() * 2)


def check_prefill_values(args: dict) -> tuple[str, str] | None:
    """The checked mode's rule: cu_seqlens runs from 0 to total_seq_len and never decreases."""
    cu, total = args["cu_seqlens"], args["q"].shape[0]
    if int(cu[0]) != 0:
        return "cu_seqlens", f"cu_seqlens[0] = {int(cu[0])}, must be 0"
    at = first_bad(cu[1:] < cu[:-1])
    if at is not None:
        i = at[0] + 1
        return "cu_seqlens", f"cu_seqlens[{i}] = {int(cu[i])} is less than cu_seqlens[{i - 1}] = {int(cu[i - 1])}"
    if int(cu[-1]) != total:
        return "cu_seqlens", f"cu_seqlens[{cu.shape[0] - 1}] = {int(cu[-1])}, must be total_seq_len = {total}"
    return None


def powers_of_two(hi: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to hi: the batch sizes engines capture CUDA graphs for (SGLang pads to them)."""
    return tuple(2 ** i for i in range(hi.bit_length()) if 2 ** i <= hi)


_COMMON = dict(family="gdn", in_place={"new_state": "state"}, rotation=STATE_ROTATION, floor=floor,
               strided=frozenset({"q", "k", "v", "a", "b"}),  # engines split them out of packed projections
               model_scalars={"scale": 1.0 / math.sqrt(128)})  # Qwen3-Next: 1/sqrt(head_size)

# ---- the engines' convention: packed q/k/v rows, a state pool, slot indices ----------------------

def build_decode_packed(axes, given, ctx) -> dict:
    """Raw q/k/v rows (the op normalises q and k), a pool of batch_size + 1 or more slots whose
    slot 0 no request uses (SGLang reserves it), the requests' slots in random order, and from 8
    requests on the last eighth of the rows padding (-1), as in a CUDA-graph batch bucket."""
    batch, slots = axes["batch_size"], axes["num_slots"]
    hv, d = axes["num_v_heads"], axes["head_size"]
    if slots < batch + 1:
        raise ValueError(f"num_slots {slots} < batch_size + 1 = {batch + 1} (slot 0 is reserved)")
    out = {}
    if "mixed_qkv" not in given:
        out["mixed_qkv"] = workloads.randn(batch, axes["qkv_dim"], generator=ctx.rng("mixed_qkv")).to(torch.bfloat16)
    for name in ("a", "b"):
        if name not in given:
            out[name] = workloads.randn(batch, hv, generator=ctx.rng(name)).to(torch.bfloat16)
    if "state_pool" not in given:
        out["state_pool"] = _state(slots, hv, d, ctx.rng("state"))
    if "state_indices" not in given:
        idx = (torch.randperm(slots - 1, generator=ctx.rng("state_indices"))[:batch] + 1).to(torch.int32)
        if batch >= 8:
            idx[batch - batch // 8:] = -1
        out["state_indices"] = idx
    if "out" not in given:  # never read: NaN, so an unwritten row cannot pass the check
        out["out"] = torch.full((batch, 1, hv, d), float("nan"), dtype=torch.bfloat16)
    out.update(_gate_params(hv, ctx))
    return out


def _pool_bytes(args: dict) -> int:
    """State bytes one call touches: the slots of its rows that are not padding."""
    pool, idx = args["state_pool"], args["state_indices"]
    live = int(((idx >= 0) & (idx < pool.shape[0])).sum())
    return live * pool[0].numel() * pool.element_size()


def floor_packed(args: dict, axes: dict) -> Floor:
    """The live slots' states read + written once, the packed rows and gates read, the output written."""
    moved = sum(args[n].numel() * args[n].element_size() for n in ("mixed_qkv", "a", "b", "out"))
    return Floor(2 * _pool_bytes(args) + moved)


def check_packed_values(args: dict) -> tuple[str, str] | None:
    """The checked mode's rule: no two rows name the same slot (padding aside)."""
    idx, slots = args["state_indices"], args["state_pool"].shape[0]
    live = idx[(idx >= 0) & (idx < slots)]
    uniq, counts = torch.unique(live, return_counts=True)
    if bool((counts > 1).any()):
        slot = int(uniq[counts > 1][0])
        return "state_indices", f"slot {slot} is named by {int(counts[uniq == slot][0])} rows"
    return None


POOL_ROTATION = Rotation("state_pool", lambda args, i, n: args["state_pool"].clone(), _pool_bytes)


def _packed_spec(hq: int, hv: int) -> Spec:
    return Spec(
        short=f"gdn_decode_packed_qk{hq}_v{hv}", family="gdn", build=build_decode_packed,
        reference="kdispatch.references.gdn_decode_packed", fit=("batch_size",), main="batch_size",
        in_place={"output": "out", "new_state_pool": "state_pool"},
        strided=frozenset({"mixed_qkv", "a", "b", "state_pool"}),  # vLLM's pool is a view into cache pages
        rotation=POOL_ROTATION, floor=floor_packed, check_values=check_packed_values,
        model_scalars={"scale": 1.0 / math.sqrt(128)},
        tolerances={"output": Tol(1e-2, 1e-2, rel_norm=2e-2), "new_state_pool": Tol(1e-2, 1e-2, rel_norm=1e-2)},
        coverage=Coverage({"batch_size": (1, 512)}, points=16, heldout=6,
                          complete=lambda axes: {**axes, "num_slots": axes["batch_size"] + 1},
                          grid={"batch_size": powers_of_two(512)}))


# ---- the engines' prefill: gates activated by the engine, a state pool, slot indices ------------

def _live_slots(n: int, slots: int, g: torch.Generator) -> torch.Tensor:
    """[n] int32: distinct slots from 1 on in random order (slot 0 stays unused, as SGLang reserves
    it), from 8 rows on the last eighth -1 (padding, as in a CUDA-graph bucket)."""
    if slots < n + 1:
        raise ValueError(f"num_slots {slots} < {n + 1} (one slot per row, slot 0 reserved)")
    idx = (torch.randperm(slots - 1, generator=g)[:n] + 1).to(torch.int32)
    if n >= 8:
        idx[n - n // 8:] = -1
    return idx


def _raw_qkv(total: int, axes: dict, given: dict, ctx) -> dict:
    """q, k [T, HQ, D] and v [T, HV, D] bf16 as the engines pass them: raw (not normalised)."""
    hq, hv, d = axes["num_q_heads"], axes["num_v_heads"], axes["head_size"]
    return {name: workloads.randn(total, heads, d, generator=ctx.rng(name)).to(torch.bfloat16)
            for name, heads in (("q", hq), ("k", hq), ("v", hv)) if name not in given}


def _raw_gates(total: int, hv: int, given: dict, ctx) -> dict:
    """Raw gate inputs a, b [T, HV] bf16 and the model's A_log, dt_bias."""
    out = {name: workloads.randn(total, hv, generator=ctx.rng(name)).to(torch.bfloat16)
           for name in ("a", "b") if name not in given}
    return {**out, **_gate_params(hv, ctx)}


def _activated_gates(total: int, hv: int, given: dict, ctx) -> dict:
    """g (log decay from the model's A_log / dt_bias ranges) and beta = sigmoid of N(0, 1), fp32
    [T, HV], as the engines activate them before their prefill call."""
    out = {}
    params = _gate_params(hv, ctx)
    if "g" not in given:
        a = workloads.randn(total, hv, generator=ctx.rng("a"))
        out["g"] = -torch.exp(params["A_log"]) * torch.nn.functional.softplus(a + params["dt_bias"])
    if "beta" not in given:
        out["beta"] = torch.sigmoid(workloads.randn(total, hv, generator=ctx.rng("b")))
    return out


def build_prefill_pool(axes, given, ctx) -> dict:
    """Raw q/k (the op normalises them), the engine's activated gates (log decay from the model's
    A_log/dt_bias ranges, beta = sigmoid of N(0, 1)), a pool whose slots three in four sequences
    continue (`has_initial_state`), int32 boundaries at random cut points."""
    total, n, slots = axes["total_seq_len"], axes["num_seqs"], axes["num_slots"]
    hv, d = axes["num_v_heads"], axes["head_size"]
    out = {**_raw_qkv(total, axes, given, ctx), **_activated_gates(total, hv, given, ctx)}
    if "state_pool" not in given:
        out["state_pool"] = _state(slots, hv, d, ctx.rng("state"))
    if "state_indices" not in given:
        out["state_indices"] = _live_slots(n, slots, ctx.rng("state_indices"))
    if "has_initial_state" not in given:
        out["has_initial_state"] = torch.rand(n, generator=ctx.rng("has_initial_state")) < 0.75
    if "cu_seqlens" not in given:
        out["cu_seqlens"] = _pool_cu_seqlens(axes, given, ctx)
    if "out" not in given:  # never read: NaN, so an unwritten row cannot pass the check
        out["out"] = torch.full((total, hv, d), float("nan"), dtype=torch.bfloat16)
    return out


def floor_pool_prefill(args: dict, axes: dict) -> Floor:
    """The live slots' states read + written once, q/k/v and the gates read, the output written."""
    moved = sum(args[n].numel() * args[n].element_size() for n in ("q", "k", "v", "g", "beta", "out"))
    return Floor(2 * _pool_bytes(args) + moved)


def half_octave_steps(lo: int, hi: int) -> list[int]:
    """log_steps(lo, hi) and the sizes halfway between its powers of two (2^(k + 1/2), rounded). Here
    rather than beside log_steps: kdispatch/spec.py is in kernels' provenance (through kdispatch.definitions)."""
    mids = {round(p * math.sqrt(2)) for p in log_steps(1, hi)}
    return sorted(set(log_steps(lo, hi)) | {m for m in mids if lo < m < hi})


def pool_prefill_grid(ranges: dict, measured: dict) -> list[dict]:
    """(tokens, sequences, longest sequence) inside the measured ranges, at powers of two (tokens at
    half octaves), the longest from an even split of the tokens to all but one token for each other sequence, and at
    every measured longest sequence (`measured`, where given) a batch of those tokens and sequences
    can have: the coverage's longest sequences fall between powers of two (an engine's do too), and
    a region they bound there had no grid shape at other token counts to bound it (a pool prefill
    at 4 value heads won by the chunked kernel on three 2,048-token batches with 1,457-1,796-token
    sequences kept every total to 32k, 1.37x slower than the baseline at 3 x 1,891 tokens; H100,
    2026-11-27). Tokens at half octaves: with both counts at powers of two every even split is one, so
    equal lengths between them (mean 521-1,023 tokens) had no grid shape, and a region of the contest
    prefill won by the staged walk on three short batches of ~1k-token sequences kept any total, 1.64x
    the baseline's time at held-out 14 x 969 tokens; with them, held-out hinted graph mean regrets
    summed over the nine prefills 26.2 -> 24.6% and 1 -> 0 slower, eager 18.1 -> 16.9% (H200 rows of
    2026-12-03); on the H100's held-out rows graph 25.0 -> 20.2% and 1 -> 0 slower, eager 105.1 ->
    100.9% (`kdispatch route --check`, 2026-12-03)."""
    out = []
    for total in half_octave_steps(*ranges["total_seq_len"]):
        for n in log_steps(*ranges["num_seqs"]):
            lo = max(-(-total // n), ranges["max_seq_len"][0])
            hi = min(total - n + 1, ranges["max_seq_len"][1])
            if n > total or lo > hi:
                continue
            at_measured = {m for m in measured.get("max_seq_len", ()) if lo <= m <= hi}
            longest = sorted(set(log_steps(lo, hi)) | at_measured)
            out += [{"total_seq_len": total, "num_seqs": n, "max_seq_len": x} for x in longest]
    return out


# One long prompt, as an engine's chunked prefill sends it in chunks of 4-16k tokens: nothing had been
# measured in one sequence between 2,048 tokens (1,024 in the pool and gathered sets) and 32,768, and the
# eager router of vLLM's prefill at 8 value heads sent held-out 1 x 27,431 to `flashinfer_direct`, 1.8x
# the baseline's time, whose FlashInfer call splits a long sequence (1,289 against 700 us; H200,
# 2026-11-30). After each prefill set's earlier grids: a grid shape's index picks a one-sequence shape's
# mix, so shapes inserted before others would renew their uuids (later grids go after these).
LONG_PROMPT_GRIDS = ({"num_seqs": (1,), "total_seq_len": (4096, 8192, 16384)},)


def past_flashinfer_split(hv: int) -> int:
    """The fewest sequences at which FlashInfer's prefill (use_cp="auto", the engines' baselines) stops
    splitting long sequences on a 132-SM Hopper: it splits while sequences x value heads x 2 < SMs
    (flashinfer 0.7.2 `should_use_cp_host`). Past it one long sequence runs serially, so a grid point
    there marks the cliff a tree cannot place from the shapes either side."""
    return -(-132 // (2 * hv))


def _pool_prefill_spec(hq: int, hv: int) -> Spec:
    return Spec(
        short=f"gdn_prefill_pool_qk{hq}_v{hv}", family="gdn", build=build_prefill_pool,
        reference="kdispatch.references.gdn_prefill_pool",
        fit=("total_seq_len", "num_seqs", "mean_seq_len"), main="total_seq_len",
        derived={"mean_seq_len": Derived("total_seq_len // max(num_seqs, 1)", "mean tokens per sequence")},
        # the fused and chunked kernels walk a sequence's chunks one after another: one long sequence
        # among short ones decides their time, which the shapes do not show (engines know the lengths)
        hints={"max_seq_len": Hint("tokens of the longest sequence", longest_sequence)},
        in_place={"output": "out", "new_state_pool": "state_pool"},
        strided=frozenset({"q", "k", "v", "state_pool"}),  # SGLang splits q/k/v out of one projection
        rotation=POOL_ROTATION, floor=floor_pool_prefill,
        check_values=lambda args: check_prefill_values(args) or check_packed_values(args),
        model_scalars={"scale": 1.0 / math.sqrt(128)},
        # as the contest prefill: chunked kernels do the intra-chunk math in bf16
        tolerances={"output": Tol(5e-2, 5e-2, rel_norm=2e-2), "new_state_pool": Tol(5e-2, 5e-2, rel_norm=1e-2)},
        reference_graph_safe=False,  # loops over cu_seqlens on the host
        # The contest prefill's ranges and length mixes, one slot per sequence; fewer points (four
        # head counts, and the recurrence's pairs are the tune's slowest), but more than 16: with 16,
        # regions of 3-5 workloads put a 1 x 1226-token call on the wrong chunked configuration and
        # left a gap of 2x in tokens where the chunked kernel lost to FlashInfer (H100, 2026-11-26).
        coverage=Coverage({"total_seq_len": (1, 32768), "num_seqs": (1, 256)}, points=24, heldout=8,
                          complete=_pool_prefill_axes, mixes=("random", "skewed", "equal"), mix=pool_prefill_mix,
                          # 4-64 sequences of 8-2,048 tokens on average, in every mix: the recurrence wins
                          # them when lengths are even or short, the chunked kernel 3-4x when one is long
                          # (held-out 369 x 7 and 563 x 12 at 8 value heads: 89 / 134 us against 29 / 33),
                          # and with 16-32 value heads FlashInfer's where they are long; with 4-16 sequences
                          # only, 1,069 tokens in 91 sequences at 32 value heads went to the chunked kernel,
                          # 2.1x slower than the recurrence (H100, 2026-11-26). 8 sequences and 1,024
                          # tokens: the fused kernel walks a sequence's chunks one after another, so one
                          # long sequence of a few hundred tokens makes it slower than FlashInfer
                          # (held-out 563 x 12 at 8 value heads: 65 us against 53, H100, 2026-11-26).
                          # 256 sequences: beyond 64 only a few random draws were measured, and a held-out
                          # 135 x 7,348 with one 6,544-token sequence went to the chunked kernel in graphs
                          # (583 us against FlashInfer's 523) and to the fused one eagerly (1,123 against
                          # 667) at 16 value heads (H100, 2026-11-27)
                          grid={"num_seqs": (4, 8, 16, 64, 256), "total_seq_len": (512, 1024, 2048, 8192)},
                          # one or two sequences of 100-1,000 tokens (a prompt or two): only random
                          # draws had measured them, none between ~90 and ~1,350 tokens, and a held-out
                          # 2 x 186-token call went to FlashInfer at 2.8x the fused kernel's time
                          # (vLLM's convention, 32 value heads, H100, 2026-11-27)
                          more_grids=({"num_seqs": (1,), "total_seq_len": (128, 256, 512, 1024)},
                                      {"num_seqs": (2,), "total_seq_len": (256, 1024)},
                                      # batches under 512 tokens: only random draws had measured them, and
                                      # held-out 48 tokens in 10 sequences went to the chunked kernel at
                                      # 3.7x the recurrence's time (no bound on tokens in its region; 4
                                      # value heads), 5 x 4 to the fused kernel at 1.6x (8; H100, 2026-11-28)
                                      {"num_seqs": (4, 16), "total_seq_len": (64,)},
                                      {"num_seqs": (4, 16, 64), "total_seq_len": (256,)},
                                      {"num_seqs": (1,), "total_seq_len": (32, 64)},
                                      # 32 sequences: between 16 and 64 the fit's threshold fell at 32, and
                                      # FlashInfer on the pool's slots lost to SGLang's gathered call from
                                      # fewer: held-out 24 x 8,906 at 4 value heads 132 us against 106 (H200,
                                      # 2026-11-28).
                                      {"num_seqs": (32,), "total_seq_len": (512, 1024, 2048, 8192)},
                                      *LONG_PROMPT_GRIDS,
                                      # 8 sequences of 16-32 tokens on average (last: see
                                      # LONG_PROMPT_GRIDS): nothing under 512 tokens had been measured at 8,
                                      # and the eager router of vLLM's prefill at 32 value heads sent
                                      # held-out 11 x 274 to the rows kernel from a region fitted on
                                      # batches of 64-128 tokens: 218.6 us against the staged path's
                                      # 79.6 (H200, 2026-11-30)
                                      {"num_seqs": (8,), "total_seq_len": (128, 256)},
                                      # One prompt of 1.5-3k tokens, where CP and the staged walk trade
                                      # places: nothing in one sequence between 1,024 and 4,096 tokens, and the
                                      # hinted graph router at 8 value heads sent SGLang's 1 x 2,048 to
                                      # `cuda_prefill_staged.r32s4` from a region of 4 x 2,048 skewed mixes
                                      # (83.8 us against SGLang's 88.3; `cuda_prefill_cp.p4` 38.0 / 83.9 us at
                                      # 1 x 1,024 / 4,096, r32s4 45.9 / 159.9; H200, 2026-12-01)
                                      {"num_seqs": (1,), "total_seq_len": (1536, 2048, 3072)},
                                      # 4-8 sequences of 2-8 tokens (a few new tokens a request past cached
                                      # prefixes): under 64 tokens at 4-8 sequences a draw or two had been
                                      # measured (at 32 value heads 5 x 16 and 8 x 27), and the staged walk
                                      # kept from the rows kernel held-out 4 x 17 at 32 value heads (12.1 us
                                      # against 9.5), vLLM's 8 x 21 at 32 (19.1 against 15.8) and 10 x 48 at
                                      # 4 (8.7 against 5.8; H200, 2026-12-02). Last: a shape's place in the
                                      # list picks a one-sequence shape's mix, so its uuid (traces/build.py).
                                      {"num_seqs": (4, 8), "total_seq_len": (16, 32)},
                                      # 16-64 sequences of 256-2,048 tokens, 16-32k in all: over 8,192 tokens
                                      # vLLM's prefill at 4 value heads had four random draws of 2-255
                                      # sequences, and its graph router gave held-out 21 x 31,434 (mean
                                      # 1,496) to the baseline, 1,189 us against CP's 285 (H200, 2026-12-03).
                                      # Last, as above.
                                      {"num_seqs": (16, 64), "total_seq_len": (16384, 32768)},
                                      # Just past FlashInfer's split (17 sequences at 4 value heads): the
                                      # one grid point near it, 16 x 32,768 with one 28,673-token prompt,
                                      # is the baseline's at 290 us (CP 297), and the hinted graph router of
                                      # vLLM's prefill at 4 value heads gave that region up to 21 sequences
                                      # and held-out 21 x 31,434 (longest 27,514) to the baseline, serial
                                      # there: 1,189 us against CP's 285 (H200, 2026-12-03). Last, as above.
                                      {"num_seqs": (past_flashinfer_split(hv),), "total_seq_len": (16384, 32768)}),
                          # Not in the set: one prompt of 768 tokens and two of 2,048 in every mix, measured
                          # on the H200 at every head count with one prompt of 1,536 / 2,048 / 3,072 tokens
                          # (2026-11-29, before CP; those rows stay in its store, the three shapes since in
                          # the set above under new uuids). Refit with them, the held-out scores moved both ways
                          # (graph mean: qk16 7.9 -> 15.0%, a 2 x 3,336 call sent to the baseline, 1.6x
                          # `flashinfer_pool_inplace.cp_off`'s time; qk2 34.0 -> 30.5%; with the
                          # longest sequence qk2 1.5 -> 4.1%; eager qk16 18.8 -> 5.1%, qk4 38.7 -> 33.3%):
                          # the mixes, not the spacing, decide there.
                          grid_every_mix=True, one_mix=one_sequence),
        # With the longest sequence known the three features decide the time, but 84 measured shapes
        # leave wide gaps where the tree's thresholds fall between neighbours far apart; estimated
        # times on a grid place them better (H100 measurements of 2026-11-27, hinted fit at 32 / 16 /
        # 8 / 4 value heads, regret mean, graph: 5-fold 6.4 / 5.6 / 7.4 / 15.0% -> 3.1 / 4.9 / 3.0 /
        # 6.3%, held-out 4.4 / 5.8 / 5.4 / 3.3% -> 3.4 / 2.4 / 3.0 / 2.3%; eager: 5-fold 5.2 / 11.1 /
        # 13.2 / 16.3% -> 3.0 / 6.4 / 3.8 / 6.1%, held-out 31.6 / 17.0 / 17.4 / 19.9% -> 7.9 / 7.5 /
        # 11.5 / 9.9%, with the hint as the longest live sequence). Without the hint one shape has
        # several times (its mixes): estimates average them, and were worse on held-out shapes than
        # the tree, which needs a win on every mix. Depth 7 on the grid (the contest prefill's) was scored
        # on both held-out stores for the pool and gathered prefills (2026-11-29): hinted graph mean
        # regrets summed over the eight 21.58 -> 20.89% (H100) and 19.53 -> 19.20% (H200), but the H100's
        # hinted eager 97.05 -> 103.05% (pool qk4 9.21 / 36.76 -> 17.20 / 63.96%): kept at 6.
        estimate=Estimate(("total_seq_len", "num_seqs", "max_seq_len"), pool_prefill_grid))


def _pool_cu_seqlens(axes: dict, given: dict, ctx) -> torch.Tensor:
    """The workload's int32 boundaries: given, or at random cut points (seeded by the workload)."""
    if "cu_seqlens" in given:
        return given["cu_seqlens"]
    return random_cu_seqlens(axes["total_seq_len"], axes["num_seqs"], ctx.rng("cu_seqlens")).to(torch.int32)


def longest_sequence(axes: dict, given: dict, ctx) -> int:
    """Tokens of the batch's longest live sequence (0 without). A padding row (slot -1) costs the
    kernels nothing and in an engine's batch carries no prompt; the workloads' padding rows carry
    tokens, and where the skewed mix put its long sequence there (8 sequences x 2,048 tokens, 1,796
    in the padding row at 4 value heads: the fused kernel 9.6 us, as for short sequences, against 34
    with equal lengths; H100, 2026-11-26), the longest over all rows told the fit the wrong work."""
    cu = _pool_cu_seqlens(axes, given, ctx).to(torch.int64)
    slots = given.get("state_indices")
    if slots is None:
        slots = _live_slots(axes["num_seqs"], axes["num_slots"], ctx.rng("state_indices"))
    lens = (cu[1:] - cu[:-1])[slots.to(torch.int64) >= 0]
    return int(lens.max()) if lens.numel() else 0


def _pool_prefill_axes(axes: dict) -> dict | None:
    """A slot per sequence plus the reserved slot 0; no more sequences than tokens."""
    if axes["num_seqs"] > axes["total_seq_len"]:
        return None
    return {**axes, "num_slots": axes["num_seqs"] + 1}


def pool_prefill_mix(axes: dict, mix: str, g: torch.Generator) -> dict:
    """prefill_mix with the engines' int32 boundaries."""
    return {name: t.to(torch.int32) for name, t in prefill_mix(axes, mix, g).items()}


# ---- vLLM's prefill: the states gathered one per sequence by the engine -------------------------

def build_prefill_gathered(axes, given, ctx) -> dict:
    """q/k L2-normalised (vLLM normalises them before the call), the engine's activated gates, one
    state per sequence, a quarter of them zeros (fresh sequences, which vLLM zeroes after its
    gather), int32 boundaries at random cut points."""
    total, n, hv, d = axes["total_seq_len"], axes["num_seqs"], axes["num_v_heads"], axes["head_size"]
    out = {name: _unit(x.float()).to(torch.bfloat16) if name != "v" else x
           for name, x in _raw_qkv(total, axes, given, ctx).items()}
    out.update(_activated_gates(total, hv, given, ctx))
    if "initial_state" not in given:
        states = _state(n, hv, d, ctx.rng("state"))
        states[torch.rand(n, generator=ctx.rng("has_initial_state")) >= 0.75] = 0.0
        out["initial_state"] = states
    if "cu_seqlens" not in given:
        out["cu_seqlens"] = _pool_cu_seqlens(axes, given, ctx)
    if "out" not in given:  # never read: NaN, so an unwritten row cannot pass the check
        out["out"] = torch.full((total, hv, d), float("nan"), dtype=torch.bfloat16)
    return out


def _gathered_bytes(args: dict) -> int:
    return args["initial_state"].numel() * args["initial_state"].element_size()


GATHERED_ROTATION = Rotation("initial_state", lambda args, i, n: args["initial_state"].clone(), _gathered_bytes)


def floor_gathered_prefill(args: dict, axes: dict) -> Floor:
    """The states read + written once, q/k/v and the gates read, the output written."""
    moved = sum(args[n].numel() * args[n].element_size() for n in ("q", "k", "v", "g", "beta", "out"))
    return Floor(2 * _gathered_bytes(args) + moved)


def longest_gathered(axes: dict, given: dict, ctx) -> int:
    """Tokens of the batch's longest sequence."""
    cu = _pool_cu_seqlens(axes, given, ctx).to(torch.int64)
    return int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0


def _gathered_prefill_spec(hq: int, hv: int) -> Spec:
    pool = _pool_prefill_spec(hq, hv)  # the same kernels, shapes and hint as the pool convention
    return Spec(
        short=f"gdn_prefill_gathered_qk{hq}_v{hv}", family="gdn", build=build_prefill_gathered,
        reference="kdispatch.references.gdn_prefill_gathered",
        fit=pool.fit, main=pool.main, derived=pool.derived,
        hints={"max_seq_len": Hint("tokens of the longest sequence", longest_gathered)},
        in_place={"output": "out", "final_state": "initial_state"},
        # vLLM splits q/k/v out of one projection: v reaches the call as a view (q/k as normalised copies)
        strided=frozenset({"q", "k", "v"}),
        rotation=GATHERED_ROTATION, floor=floor_gathered_prefill, check_values=check_prefill_values,
        model_scalars=pool.model_scalars,
        tolerances={"output": pool.tolerances["output"], "final_state": pool.tolerances["new_state_pool"]},
        reference_graph_safe=False,
        coverage=dataclasses.replace(pool.coverage,  # no pool: no slot count to fill in
                                     complete=lambda a: a if a["num_seqs"] <= a["total_seq_len"] else None,
                                     # under 512 tokens only random draws (8 at 32 value heads): held-out
                                     # 119 x 7 and 356 x 19 with one long sequence went to the recurrence,
                                     # 1.3x slower than vLLM's FlashInfer call eagerly (H100, 2026-11-27)
                                     more_grids=({"num_seqs": (4, 16, 64), "total_seq_len": (128, 256)},
                                                 *pool.coverage.more_grids)),
        estimate=pool.estimate)


# ---- the engines' speculative verification (SGLang's contract) -------------------------------------

def build_verify(axes, given, ctx) -> dict:
    """num_seqs requests of cache_steps draft tokens each (raw q/k, raw gates), a pool of num_seqs + 1
    slots (slot 0 unused) and a cache row per request, both in random order; from 8 requests on the
    last eighth are padding (slot and cache row -1), as in a CUDA-graph bucket."""
    n, steps, total = axes["num_seqs"], axes["cache_steps"], axes["total_seq_len"]
    hv, d = axes["num_v_heads"], axes["head_size"]
    if total != n * steps:
        raise ValueError(f"total_seq_len {total} != num_seqs {n} x cache_steps {steps}")
    if axes["num_cache_rows"] < n:
        raise ValueError(f"num_cache_rows {axes['num_cache_rows']} < num_seqs {n}")
    out = {**_raw_qkv(total, axes, given, ctx), **_raw_gates(total, hv, given, ctx)}
    if "state_pool" not in given:
        out["state_pool"] = _state(axes["num_slots"], hv, d, ctx.rng("state"))
    if "state_indices" not in given:
        out["state_indices"] = _live_slots(n, axes["num_slots"], ctx.rng("state_indices"))
    if "cu_seqlens" not in given:
        out["cu_seqlens"] = torch.arange(0, total + 1, steps, dtype=torch.int32)
    if "intermediate_states" not in given:  # rows a call does not store into must keep these zeros
        out["intermediate_states"] = torch.zeros(axes["num_cache_rows"], steps, hv, d, d)
    if "cache_indices" not in given:
        rows = torch.randperm(axes["num_cache_rows"], generator=ctx.rng("cache_indices"))[:n].to(torch.int32)
        if n >= 8:
            rows[n - n // 8:] = -1
        out["cache_indices"] = rows
    return out


def _stored_bytes(args: dict) -> int:
    """Intermediate-state bytes one call stores: the steps of each request that stores them."""
    inter, rows, cu = args["intermediate_states"], args["cache_indices"], args["cu_seqlens"]
    lengths = (cu[1:] - cu[:-1]).clamp(min=0)
    cached = (rows >= 0) & (rows < inter.shape[0]) & (lengths <= inter.shape[1])
    return int(lengths[cached].sum()) * inter[0, 0].numel() * inter.element_size()


def floor_verify(args: dict, axes: dict) -> Floor:
    """The live slots' states read once, the stored steps' states written once, q/k/v and the gates
    read, the output (bf16, v's shape) written."""
    moved = sum(args[n].numel() * args[n].element_size() for n in ("q", "k", "v", "a", "b")) + args["v"].numel() * 2
    return Floor(_pool_bytes(args) + _stored_bytes(args) + moved)


def check_verify_values(args: dict) -> tuple[str, str] | None:
    """The checked mode's rule: well-formed boundaries, no two requests storing into one cache row."""
    bad = check_prefill_values(args)
    if bad is not None:
        return bad
    rows, n = args["cache_indices"], args["intermediate_states"].shape[0]
    live = rows[(rows >= 0) & (rows < n)]
    uniq, counts = torch.unique(live, return_counts=True)
    if bool((counts > 1).any()):
        row = int(uniq[counts > 1][0])
        return "cache_indices", f"cache row {row} is named by {int(counts[uniq == row][0])} requests"
    return None


def _verify_axes(axes: dict) -> dict:
    """Equal draft lengths; a slot and a cache row per request (slot 0 reserved)."""
    n, steps = axes["num_seqs"], axes["cache_steps"]
    return {**axes, "total_seq_len": n * steps, "num_slots": n + 1, "num_cache_rows": n}


def _verify_spec(hq: int, hv: int) -> Spec:
    return Spec(
        short=f"gdn_verify_qk{hq}_v{hv}", family="gdn", build=build_verify,
        reference="kdispatch.references.gdn_verify", fit=("num_seqs", "cache_steps"), main="num_seqs",
        in_place={"new_intermediate_states": "intermediate_states"},  # the output is new, as SGLang's
        strided=frozenset({"q", "k", "v", "a", "b", "state_pool"}),  # split out of one projection row
        rotation=POOL_ROTATION, floor=floor_verify, check_values=check_verify_values,
        model_scalars={"scale": 1.0 / math.sqrt(128)},
        tolerances={"output": Tol(1e-2, 1e-2, rel_norm=2e-2), "new_intermediate_states": Tol(1e-2, 1e-2, rel_norm=1e-2)},
        reference_graph_safe=False,  # loops over the steps on the host
        # speculative decoding batches (decode sizes) of 2-8 tokens a request (MTP 1-3 drafts + 1,
        # EAGLE chains up to 7)
        coverage=Coverage({"num_seqs": (1, 256), "cache_steps": (2, 8)}, points=12, heldout=4,
                          complete=_verify_axes,
                          # SGLang's CUDA-graph batch sizes at its default 4 draft tokens: the router split
                          # between 14 and 17 requests and served 16 with the slower kernel
                          grid={"num_seqs": powers_of_two(256), "cache_steps": (4,)}))


# ---- the engines' speculative verification (vLLM's contract) --------------------------------------

def build_verify_steps(axes, given, ctx) -> dict:
    """num_seqs requests of num_steps draft tokens each (raw q/k, raw gates), a distinct slot per
    request and step in a pool whose slot 0 is vLLM's null block, 1 to num_steps accepted steps;
    from 8 requests on the last eighth are padding (null slots), as in a CUDA-graph bucket."""
    n, steps, total = axes["num_seqs"], axes["num_steps"], axes["total_seq_len"]
    hv, d = axes["num_v_heads"], axes["head_size"]
    if total != n * steps:
        raise ValueError(f"total_seq_len {total} != num_seqs {n} x num_steps {steps}")
    if axes["num_slots"] < n * steps + 1:
        raise ValueError(f"num_slots {axes['num_slots']} < {n * steps + 1} (a slot per step, slot 0 null)")
    out = {**_raw_qkv(total, axes, given, ctx), **_raw_gates(total, hv, given, ctx)}
    if "state_pool" not in given:
        out["state_pool"] = _state(axes["num_slots"], hv, d, ctx.rng("state"))
    if "step_slots" not in given:
        slots = (torch.randperm(axes["num_slots"] - 1, generator=ctx.rng("step_slots"))[:n * steps] + 1)
        slots = slots.view(n, steps).to(torch.int32)
        if n >= 8:
            slots[n - n // 8:] = 0
        out["step_slots"] = slots
    if "num_accepted" not in given:
        out["num_accepted"] = torch.randint(1, steps + 1, (n,), generator=ctx.rng("num_accepted"), dtype=torch.int32)
    if "cu_seqlens" not in given:
        out["cu_seqlens"] = torch.arange(0, total + 1, steps, dtype=torch.int32)
    return out


def _step_pool_bytes(args: dict) -> int:
    """State bytes one call moves: each live request's starting state read and its stored steps written."""
    pool, slots, acc = args["state_pool"], args["step_slots"], args["num_accepted"]
    steps, num_slots = slots.shape[1], pool.shape[0]
    src = slots.gather(1, (acc.long() - 1).clamp(0, steps - 1)[:, None])[:, 0]
    live = (acc >= 1) & (acc <= steps) & (src >= 1) & (src < num_slots)
    stored = ((slots >= 1) & (slots < num_slots))[live].sum()
    return int(live.sum() + stored) * pool[0].numel() * pool.element_size()


def floor_verify_steps(args: dict, axes: dict) -> Floor:
    """The live requests' starting states read, their steps' states written once, q/k/v and the
    gates read, the output (bf16, v's shape) written."""
    moved = sum(args[n].numel() * args[n].element_size() for n in ("q", "k", "v", "a", "b")) + args["v"].numel() * 2
    return Floor(_step_pool_bytes(args) + moved)


def check_verify_steps_values(args: dict) -> tuple[str, str] | None:
    """The checked mode's rule: well-formed boundaries, no slot named by two steps (null slot aside)."""
    bad = check_prefill_values(args)
    if bad is not None:
        return bad
    slots, n = args["step_slots"], args["state_pool"].shape[0]
    live = slots[(slots >= 1) & (slots < n)]
    uniq, counts = torch.unique(live, return_counts=True)
    if bool((counts > 1).any()):
        slot = int(uniq[counts > 1][0])
        return "step_slots", f"slot {slot} is named by {int(counts[uniq == slot][0])} steps"
    return None


def _verify_steps_axes(axes: dict) -> dict:
    """Equal draft lengths; a slot per request and step, plus the null slot 0."""
    n, steps = axes["num_seqs"], axes["num_steps"]
    return {**axes, "total_seq_len": n * steps, "num_slots": n * steps + 1}


STEP_POOL_ROTATION = Rotation("state_pool", lambda args, i, n: args["state_pool"].clone(), _step_pool_bytes)


def _verify_steps_spec(hq: int, hv: int) -> Spec:
    return Spec(
        short=f"gdn_verify_steps_qk{hq}_v{hv}", family="gdn", build=build_verify_steps,
        reference="kdispatch.references.gdn_verify_steps", fit=("num_seqs", "num_steps"), main="num_seqs",
        in_place={"new_state_pool": "state_pool"},  # the output is new, as vLLM's kernel returns it
        # vLLM's pool is a view into cache pages, its step slots a slice of the block table
        strided=frozenset({"q", "k", "v", "a", "b", "state_pool", "step_slots"}),
        rotation=STEP_POOL_ROTATION, floor=floor_verify_steps, check_values=check_verify_steps_values,
        model_scalars={"scale": 1.0 / math.sqrt(128)},
        tolerances={"output": Tol(1e-2, 1e-2, rel_norm=2e-2), "new_state_pool": Tol(1e-2, 1e-2, rel_norm=1e-2)},
        reference_graph_safe=False,  # loops over the steps on the host
        coverage=Coverage({"num_seqs": (1, 256), "num_steps": (2, 8)}, points=12, heldout=4,
                          complete=_verify_steps_axes))


SPECS = {
    "gdn_decode_qk4_v8_d128_k_last": Spec(
        short="gdn_decode", build=build_decode, reference="kdispatch.references.gdn_decode",
        fit=("batch_size",), main="batch_size",
        coverage=Coverage({"batch_size": (1, 1024)}, points=40, heldout=12, grid={"batch_size": powers_of_two(1024)}),
        # FlashInfer-Bench's default 1e-2 elementwise, with the norm bounds of benchmarks/gdn.py.
        tolerances={"output": Tol(1e-2, 1e-2, rel_norm=2e-2), "new_state": Tol(1e-2, 1e-2, rel_norm=1e-2)},
        **_COMMON),
    "gdn_prefill_qk4_v8_d128_k_last": Spec(
        short="gdn_prefill", build=build_prefill, reference="kdispatch.references.gdn_prefill",
        # Regions are boxes of total tokens x sequences, measured over every length mix: the recurrent
        # kernels' time follows the longest sequence, which a shape does not show (one long sequence
        # among short ones has the mean of many equal ones). The mean is a third feature because the
        # boundary between them and the chunked kernels runs along it (a diagonal in the other two).
        fit=("total_seq_len", "num_seqs", "mean_seq_len"), main="total_seq_len",
        derived={"mean_seq_len": Derived("total_seq_len // max(num_seqs, 1)", "mean tokens per sequence")},
        # a caller that knows the longest sequence gets the regions fitted with it, as the engines'
        # conventions do (the pool prefill's comments below say why it decides)
        hints={"max_seq_len": Hint("tokens of the longest sequence", longest_prefill)},
        # Depth 7 on the estimated grid: at 6 the hinted tree ran out of depth before it split tens of
        # few-token prompts by their longest one (the rows kernel up to ~9 tokens, the fused chunks
        # beyond) and sent held-out 17 x 24 tokens (longest 3) to the fused chunks, 2x slower. Scored
        # 2026-11-29 with the coverage grids below: hinted graph mean / max H200 6.82 / 102.81% -> 4.23 / 22.13%,
        # H100 (its rows without those grids) 4.53 / 38.03% -> 3.38 / 38.03%, eager hinted H100 10.52 ->
        # 9.69%, H200 2.29 -> 2.31%
        estimate=Estimate(("total_seq_len", "num_seqs", "max_seq_len"), pool_prefill_grid, max_depth=7),
        # Chunked kernels do the intra-chunk math in bf16 (measured ~4e-3 norm error for FlashInfer
        # and fla, whose worst element over millions exceeds 1e-2): 5e-2 elementwise, and the norm
        # bounds catch any systematic drift.
        tolerances={"output": Tol(5e-2, 5e-2, rel_norm=2e-2), "new_state": Tol(5e-2, 5e-2, rel_norm=1e-2)},
        reference_graph_safe=False,  # loops over cu_seqlens on the host
        # On one H100 (2026-11-22/23) fla-core's chunk prefill at total_seq_len 2857 ran 98.5 us in
        # two processes and 111.7 and 116.9 us in two others, while FlashInfer ran 105-106 us in all
        # four: a 1.07x win in the tune became a 0.95x loss in the bench. Likely cause (not
        # verified): fla-core autotunes its Triton kernels per process and does not always pick
        # the same configuration.
        run_to_run={"fla_chunk": 0.2},
        check_values=check_prefill_values,
        # Engines batch 1 to a few hundred sequences of 1 token to 32k; lengths uniform, one long
        # among short ones, or all equal.
        coverage=Coverage({"total_seq_len": (1, 32768), "num_seqs": (1, 256)}, points=80, heldout=24,
                          complete=lambda a: a if a["num_seqs"] <= a["total_seq_len"] else None,
                          mixes=("random", "skewed", "equal"), mix=prefill_mix,
                          # few sequences of 100-800 tokens: where the recurrence hands over to the
                          # chunked kernels (one sequence of 300 went to the slower side without it)
                          grid={"num_seqs": (1, 2, 4, 8), "total_seq_len": (128, 192, 256, 384, 512, 768)},
                          # at 2-4 sequences of a few hundred tokens the mix decides between the
                          # recurrence and FlashInfer (held-out 370 x 3, one long: 49% regret)
                          # One or two prompts of 0.6-2k tokens: the 16-token chunked kernel beats
                          # FlashInfer there up to ~1.1k tokens in one sequence, and nothing had been
                          # measured between 768 and 1,377: the router gave 1 x 1,000 to FlashInfer,
                          # 18% slower (issue 15's reported shape; 52.8 against 44.7 us, H200, 2026-11-29)
                          more_grids=({"num_seqs": (1,), "total_seq_len": (640, 896, 1024, 1152, 1280, 1536, 2048)},
                                      {"num_seqs": (2,), "total_seq_len": (1024, 1536, 2048)},
                                      # Four to eight prompts of 2-4k tokens, the longest 1-3.6k: FlashInfer
                                      # with its long-sequence split off (`cp_off`) wins while the longest is
                                      # short against the others; nothing had been measured at 4-12 sequences
                                      # of 2-5k tokens, and the hinted router gave held-out 4 x 2,230 (longest
                                      # 1,057) and 8 x 4,402 (1,817) to FlashInfer, 38% and 33% slower
                                      # (H200, 2026-11-29)
                                      {"num_seqs": (4, 8), "total_seq_len": (2048, 3072, 4096)},
                                      # Tens of prompts of a few tokens each, where the per-sequence rows kernel,
                                      # the fused chunks and FlashInfer trade places with the longest: few
                                      # workloads had been measured there, and the grid above moved the regions
                                      # they had held (held-out 17 x 24 and 10 x 33 tokens went to the fused
                                      # chunks, 2x and 1.4x slower than the rows kernel; H200, 2026-11-29)
                                      {"num_seqs": (12, 24), "total_seq_len": (24, 48, 96, 192)},
                                      *LONG_PROMPT_GRIDS,
                                      # A hundred or more prompts of 50-200 tokens, 12-25k in all (a chunked-
                                      # prefill batch): four draws had been measured at over 100 sequences and
                                      # 5k tokens, the one under 94 tokens a sequence a skewed mix, which the
                                      # staged walk wins by its long sequence, and the router sent held-out
                                      # 173 x 15,286 and 222 x 20,838 of random lengths to it, 12% and 16%
                                      # slower than FlashInfer (H200, 2026-12-02).
                                      # Last, as new grids go (traces/build.py: a shape's place picks a
                                      # one-sequence shape's mix, so its uuid)
                                      {"num_seqs": (128, 192, 256), "total_seq_len": (12288, 16384, 24576)},
                                      # Two to tens of prompts of 1-16k tokens, 16-32k in all: nothing had
                                      # been measured there but one draw (3 x 24,676) and the one-prompt grid;
                                      # the eager router sent held-out 3 x 14,504 to FlashInfer, 1.8x CP's
                                      # time (736 against 402 us), and the hinted eager one 2 x 21,128 to CP
                                      # from four workloads, slower than FlashInfer live on 12-03 (H200).
                                      # Last, as above.
                                      {"num_seqs": (2, 4, 16), "total_seq_len": (16384, 32768)},
                                      # just past FlashInfer's split (9 sequences at these 8 value heads), as the
                                      # pool prefills' last grid
                                      {"num_seqs": (past_flashinfer_split(8),), "total_seq_len": (16384, 32768)}),
                          grid_every_mix=True, one_mix=one_sequence),
        **_COMMON),
    **{packed_name(hq, hv): _packed_spec(hq, hv) for hq, hv in PACKED_HEADS.values()},
    **{pool_prefill_name(hq, hv): _pool_prefill_spec(hq, hv) for hq, hv in PACKED_HEADS.values()},
    **{gathered_prefill_name(hq, hv): _gathered_prefill_spec(hq, hv) for hq, hv in GATHERED_HEADS.values()},
    **{verify_name(hq, hv): _verify_spec(hq, hv) for hq, hv in PACKED_HEADS.values()},
    **{verify_steps_name(hq, hv): _verify_steps_spec(hq, hv) for hq, hv in PACKED_HEADS.values()},
}
