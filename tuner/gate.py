"""Correctness gate: is a variant's output right for this workload? FlashInfer-Bench semantics.

For each of several trials (fresh inputs: the workload materialised under a derived uuid, so every
per-call tensor differs while the shared cache pools and MoE weights stay, as in serving), the
variant is called on private copies of the inputs and compared with the project's reference
(computed in float32) on the same inputs:

- an exception, or outputs of the wrong number, shape or dtype, fail (RUNTIME_ERROR,
  INCORRECT_SHAPE, INCORRECT_DTYPE);
- NaN or Inf where the reference is finite always fails (INCORRECT_NUMERICAL);
- value-returning variants cannot have their outputs poisoned, so the CUDA caching allocator is:
  blocks the size of each output are filled with 0x7F bytes (a huge finite float, a NaN in FP8,
  an unreachable index in int32) and freed just before the call, so an output element a kernel
  forgets to write is very likely garbage rather than a lucky zero (best effort: the allocator
  may hand out other blocks);
- per-output tolerances come from `TOLERANCES`, one table: an element matches when
  |x - ref| <= atol or |x - ref| <= rtol * |ref| (FlashInfer-Bench's `compute_error_stats`), and
  at least `matched_ratio` of the elements must match (1.0 except FP8 MoE, 0.95 as
  flashinfer_bench 0.1.2's LowBitEvaluator); optionally also ||x - ref|| / ||ref|| <= rel_norm;
- GDN: `new_state` must be the `state` argument itself (the in-place contract) and match the
  reference state;
- DSA indexer: per row, the first min(2048, seq_len) entries are valid token ids of that
  sequence (reachable through its block table), without duplicates, the rest are -1, and the
  selected tokens' scores (recomputed with the reference scoring) sorted descending equal the
  reference's top scores within tolerance: ties may be broken either way;
- DSA sparse attention: output and base-2 lse; a row without any valid index must give exactly
  zeros and lse = -inf;
- FP8 MoE: matched ratio >= 0.95 with atol = 1, rtol = 0.3.

Everything here runs on CPU tensors too (the tests use it there).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from kdispatch import definitions as defs
from kdispatch import registry

GDN_DECODE = "gdn_decode_qk4_v8_d128_k_last"
GDN_PREFILL = "gdn_prefill_qk4_v8_d128_k_last"
DSA_INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
DSA_SPARSE = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
MOE_FP8 = "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"

PASSED, RUNTIME_ERROR = "PASSED", "RUNTIME_ERROR"
INCORRECT_SHAPE, INCORRECT_DTYPE, INCORRECT_NUMERICAL = "INCORRECT_SHAPE", "INCORRECT_DTYPE", "INCORRECT_NUMERICAL"


@dataclass(frozen=True)
class Tol:
    atol: float
    rtol: float
    matched_ratio: float = 1.0  # fraction of elements that must match
    rel_norm: float | None = None  # bound on ||x - ref|| / ||ref|| as well


# One table. GDN: FlashInfer-Bench's default 1e-2 elementwise for decode; prefill relaxed to 5e-2
# elementwise because chunked kernels do the intra-chunk math in bf16 (measured ~4e-3 norm error for
# FlashInfer and fla, whose worst element over millions exceeds 1e-2), with the norm bounds of
# benchmarks/gdn.py (output 2e-2, state 1e-2) catching any systematic drift. Indexer: `atol` is a
# fraction of the row's largest reference score (scores have no natural unit).
TOLERANCES: dict[str, dict[str, Tol]] = {
    GDN_DECODE: {"output": Tol(1e-2, 1e-2, rel_norm=2e-2), "new_state": Tol(1e-2, 1e-2, rel_norm=1e-2)},
    GDN_PREFILL: {"output": Tol(5e-2, 5e-2, rel_norm=2e-2), "new_state": Tol(5e-2, 5e-2, rel_norm=1e-2)},
    DSA_INDEXER: {"topk_indices": Tol(1e-2, 1e-2)},
    DSA_SPARSE: {"output": Tol(1e-2, 1e-2), "lse": Tol(1e-2, 1e-2)},
    MOE_FP8: {"output": Tol(1.0, 0.3, matched_ratio=0.95)},
}

# Outputs that are inputs updated in place: output name -> input name.
IN_PLACE: dict[str, dict[str, str]] = {GDN_DECODE: {"new_state": "state"}, GDN_PREFILL: {"new_state": "state"}}

# Inputs that are shared across calls (the serving engine's pools and weights) and never written:
# they are not copied per call.
SHARED: dict[str, frozenset] = {
    DSA_INDEXER: frozenset({"k_index_cache_fp8"}),
    DSA_SPARSE: frozenset({"ckv_cache", "kpe_cache"}),
    MOE_FP8: frozenset({"gemm1_weights", "gemm1_weights_scale", "gemm2_weights", "gemm2_weights_scale"}),
}

POISON_BYTE = 0x7F


@dataclass
class Verdict:
    status: str
    reason: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    metrics: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == PASSED


@dataclass
class Reference:
    """What one trial is checked against: the reference outputs and, per definition, extras."""

    outputs: tuple
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# Inputs and the reference
# ----------------------------------------------------------------------------------------------

def input_names(definition: str) -> list[str]:
    return list(defs.load(definition)["inputs"])


def output_names(definition: str) -> list[str]:
    return list(defs.load(definition)["outputs"])


def private_copy(definition: str, args) -> list:
    """The arguments with every tensor copied, except the shared pools/weights."""
    shared = SHARED.get(defs.resolve_name(definition), frozenset())
    return [a.clone() if isinstance(a, torch.Tensor) and n not in shared else a
            for n, a in zip(input_names(definition), args)]


def trial_workload(workload: dict, trial: int) -> dict:
    """Trial 0 is the workload itself; trial t > 0 the same axes and inputs under the uuid
    '<uuid>#t' (fresh per-call inputs; cache pools and MoE weights shared, as in serving)."""
    if trial == 0:
        return workload
    return {**workload, "uuid": f"{workload['uuid']}#{trial}"}


def as_tuple(out, n: int) -> tuple | None:
    if isinstance(out, torch.Tensor):
        return (out,) if n == 1 else None
    if isinstance(out, (tuple, list)) and len(out) == n:
        return tuple(out)
    return None


def reference(definition: str, args) -> Reference:
    """Runs the project's reference on copies of `args` (float32 math inside)."""
    definition = defs.resolve_name(definition)
    ref = registry.get(definition, registry.REFERENCE)
    with torch.no_grad():
        out = as_tuple(ref.fn(*private_copy(definition, args)), len(output_names(definition)))
    extra = {}
    if definition == DSA_INDEXER:
        extra["scores"], extra["token_ids"] = indexer_scores(*args)
    return Reference(tuple(o.detach() for o in out), extra)


# ----------------------------------------------------------------------------------------------
# Calling the variant
# ----------------------------------------------------------------------------------------------

def poison_allocator(sizes: list[int], device: torch.device) -> None:
    """Fills freshly allocated CUDA blocks of these byte sizes with 0x7F and frees them, so the
    caching allocator likely hands them to the next allocations of those sizes."""
    if device.type != "cuda":
        return
    blocks = [torch.empty(max(int(s), 1), dtype=torch.uint8, device=device).fill_(POISON_BYTE) for s in sizes]
    del blocks


def _healthy(device: torch.device) -> bool:
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        return bool(torch.ones(1, device=device).add_(1).item() == 2)
    except Exception:
        return False


class ContextLost(RuntimeError):
    """The CUDA context is unusable after a variant's error (illegal address, ...): the worker
    must exit so that the run can go on in a fresh process."""


def run_gate(definition: str, fn: Callable, trials: list[tuple[list, Reference]], check_in_place: bool = True
             ) -> Verdict:
    """Checks `fn` on every (inputs, reference) trial; the first failure decides the verdict.
    `check_in_place=False` skips the in-place contract (for foreign calls benchmarked side by side)."""
    definition = defs.resolve_name(definition)
    outs_n = output_names(definition)
    in_names = input_names(definition)
    worst_abs, worst_rel, metrics = 0.0, 0.0, {}
    for t, (args, ref) in enumerate(trials):
        call_args = private_copy(definition, args)
        device = next(a.device for a in call_args if isinstance(a, torch.Tensor))
        poison_allocator([o.numel() * o.element_size() for o in ref.outputs], device)
        try:
            with torch.no_grad():
                raw = fn(*call_args)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:
            msg = f"trial {t}: {type(exc).__name__}: {exc}"[:500]
            if not _healthy(device):
                raise ContextLost(msg) from exc
            return Verdict(RUNTIME_ERROR, msg)
        out = as_tuple(raw, len(outs_n))
        if out is None or not all(isinstance(o, torch.Tensor) for o in out):
            return Verdict(INCORRECT_SHAPE, f"trial {t}: expected {len(outs_n)} tensor output(s) {outs_n}, "
                                            f"got {type(raw).__name__}")
        for name, o, r in zip(outs_n, out, ref.outputs):
            if tuple(o.shape) != tuple(r.shape):
                return Verdict(INCORRECT_SHAPE, f"trial {t}: {name} has shape {tuple(o.shape)}, expected {tuple(r.shape)}")
            if o.dtype != r.dtype:
                return Verdict(INCORRECT_DTYPE, f"trial {t}: {name} has dtype {o.dtype}, expected {r.dtype}")
        for oname, iname in (IN_PLACE.get(definition, {}) if check_in_place else {}).items():
            o = out[outs_n.index(oname)]
            if o is not call_args[in_names.index(iname)]:
                return Verdict(INCORRECT_NUMERICAL, f"trial {t}: {oname} is not the {iname!r} argument "
                                                    "(the in-place contract)", metrics={"in_place": False})
        v = check_outputs(definition, call_args, out, ref)
        v.reason = f"trial {t}: {v.reason}" if v.reason else ""
        worst_abs = _max(worst_abs, v.max_abs_err)
        worst_rel = _max(worst_rel, v.max_rel_err)
        for k, x in v.metrics.items():
            metrics[k] = x if k not in metrics else _worse(k, metrics[k], x)
        if not v.passed:
            v.max_abs_err, v.max_rel_err, v.metrics = worst_abs, worst_rel, metrics
            return v
    return Verdict(PASSED, "", worst_abs, worst_rel, {**metrics, "trials": len(trials)})


def _max(a, b):
    if b is None:
        return a
    if a is None or (isinstance(b, float) and math.isnan(b)):
        return b
    return max(a, b)


def _worse(key: str, a, b):
    """Aggregate a metric over trials: the minimum for ratios that must be high, else the maximum."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return b
    return min(a, b) if "matched" in key else max(a, b)


# ----------------------------------------------------------------------------------------------
# Output comparisons
# ----------------------------------------------------------------------------------------------

def compare(name: str, x: torch.Tensor, ref: torch.Tensor, tol: Tol) -> Verdict:
    """FlashInfer-Bench elementwise comparison of one output (float32 math), NaN/Inf always failing."""
    x32, r32 = x.detach().float(), ref.detach().float()
    finite_ref = torch.isfinite(r32)
    bad = ~torch.isfinite(x32) & finite_ref
    if bool(bad.any()):
        n_nan = int(torch.isnan(x32).sum())
        return Verdict(INCORRECT_NUMERICAL, f"{name}: {int(bad.sum())} non-finite values ({n_nan} NaN)",
                       float("nan"), float("nan"), {f"{name}.nonfinite": int(bad.sum())})
    if x32.numel() == 0:
        return Verdict(PASSED, "", 0.0, 0.0, {})
    err = torch.where(finite_ref, (x32 - r32).abs(), torch.zeros_like(x32))
    rel = err / (r32.abs().nan_to_num(posinf=0.0, neginf=0.0) + 1e-8)
    exceed = (err > tol.atol) & (rel > tol.rtol)
    matched = 1.0 - float(exceed.sum()) / float(err.numel())
    max_abs, max_rel = float(err.max()), float(rel.max())
    metrics = {f"{name}.max_abs": max_abs, f"{name}.matched_ratio": matched}
    rn = None
    if tol.rel_norm is not None:
        rf = torch.where(finite_ref, r32, torch.zeros_like(r32))
        rn = float(err.norm() / rf.norm().clamp_min(1e-12))
        metrics[f"{name}.rel_norm"] = rn
    if matched < tol.matched_ratio:
        what = (f"{int(exceed.sum())} of {err.numel()} elements" if tol.matched_ratio >= 1.0
                else f"matched ratio {matched:.4f} < {tol.matched_ratio}")
        return Verdict(INCORRECT_NUMERICAL, f"{name}: {what} beyond atol={tol.atol} rtol={tol.rtol} "
                                            f"(max abs err {max_abs:.3g})", max_abs, max_rel, metrics)
    if rn is not None and rn > tol.rel_norm:
        return Verdict(INCORRECT_NUMERICAL, f"{name}: relative norm error {rn:.3g} > {tol.rel_norm}",
                       max_abs, max_rel, metrics)
    return Verdict(PASSED, "", max_abs, max_rel, metrics)


def _combine(verdicts: list[Verdict]) -> Verdict:
    out = Verdict(PASSED, "", 0.0, 0.0, {})
    for v in verdicts:
        out.max_abs_err = _max(out.max_abs_err, v.max_abs_err)
        out.max_rel_err = _max(out.max_rel_err, v.max_rel_err)
        out.metrics.update(v.metrics)
        if not v.passed and out.passed:
            out.status, out.reason = v.status, v.reason
    return out


def check_outputs(definition: str, args, out: tuple, ref: Reference) -> Verdict:
    definition = defs.resolve_name(definition)
    checker = _CHECKERS.get(definition, _check_elementwise)
    return checker(definition, args, out, ref)


def _check_elementwise(definition, args, out, ref) -> Verdict:
    tols = TOLERANCES.get(definition, {})
    names = output_names(definition)
    return _combine([compare(n, o, r, tols.get(n, Tol(1e-2, 1e-2))) for n, o, r in zip(names, out, ref.outputs)])


def _check_sparse_attention(definition, args, out, ref) -> Verdict:
    output, lse = out
    ref_out, ref_lse = ref.outputs
    empty = torch.isneginf(ref_lse)  # [T, H]: rows without any valid index
    if bool(empty.any()):
        if not bool(torch.isneginf(lse[empty]).all()):
            return Verdict(INCORRECT_NUMERICAL, "lse: a row without valid indices must be -inf",
                           float("inf"), float("inf"))
        if not bool((output[empty].float() == 0).all()):
            return Verdict(INCORRECT_NUMERICAL, "output: a row without valid indices must be zeros",
                           float("inf"), float("inf"))
    if bool(torch.isneginf(lse[~empty]).any()):
        return Verdict(INCORRECT_NUMERICAL, "lse: -inf for a row with valid indices", float("inf"), float("inf"))
    tols = TOLERANCES[definition]
    return _combine([compare("output", output, ref_out, tols["output"]),
                     compare("lse", lse, ref_lse, tols["lse"])])


# ---- DSA indexer -----------------------------------------------------------------------------

def indexer_scores(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    """The reference's scoring of every cached token of every sequence.

    Returns (scores [B, W] float32, -inf past a sequence's end; token_ids [B, W] int64, the global
    id page * 64 + slot of position j, -1 past the end), W = max_num_pages * 64."""
    batch, heads, dim = q_index_fp8.shape
    num_pages, page, _, width_bytes = k_index_cache_fp8.shape
    max_pages = block_table.shape[1]
    width = max_pages * page
    device = q_index_fp8.device
    lens = seq_lens.to(device=device, dtype=torch.long)
    if batch == 0 or width == 0:
        return (torch.empty(batch, width, device=device), torch.full((batch, width), -1, dtype=torch.long, device=device))
    page_used = torch.arange(max_pages, device=device)[None, :] * page < lens[:, None]
    pages = torch.where(page_used, block_table.to(device=device, dtype=torch.long), 0)
    raw = k_index_cache_fp8.view(torch.uint8).reshape(num_pages, page * width_bytes)[pages]
    keys = raw[..., : page * dim].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    scale = raw[..., page * dim:].contiguous().view(torch.float32)
    keys = (keys.view(batch, max_pages, page, dim) * scale.view(batch, max_pages, page, 1)).view(batch, width, dim)
    logits = torch.matmul(q_index_fp8.to(torch.float32), keys.transpose(1, 2))  # [B, H, W]
    scores = (torch.relu(logits) * weights.to(torch.float32)[:, :, None]).sum(dim=1)
    pos = torch.arange(width, device=device)
    in_seq = pos[None, :] < lens[:, None]
    scores = scores.masked_fill(~in_seq, float("-inf"))
    token_ids = torch.gather(pages, 1, (pos // page)[None, :].expand(batch, -1)) * page + pos % page
    return scores, torch.where(in_seq, token_ids, torch.full_like(token_ids, -1))


def _check_indexer(definition, args, out, ref) -> Verdict:
    (idx,) = out
    scores, token_ids = ref.extra["scores"], ref.extra["token_ids"]
    seq_lens = args[input_names(definition).index("seq_lens")]
    tol = TOLERANCES[definition]["topk_indices"]
    batch, k = idx.shape
    width = scores.shape[1]
    device = idx.device
    lens = seq_lens.to(device=device, dtype=torch.long)
    n = lens.clamp(max=min(k, width))  # valid entries per row
    slot = torch.arange(k, device=device)
    want = slot[None, :] < n[:, None]
    ids = idx.to(torch.long)
    if bool((ids[~want] != -1).any()):
        rows = sorted({int(r) for r in torch.nonzero((ids != -1) & ~want)[:, 0].tolist()})[:5]
        return Verdict(INCORRECT_NUMERICAL, f"rows {rows}: entries after the first min(2048, seq_len) must be -1",
                       metrics={"padding_ok": False})
    if bool((ids[want] < 0).any()):
        rows = sorted({int(r) for r in torch.nonzero((ids < 0) & want)[:, 0].tolist()})[:5]
        return Verdict(INCORRECT_NUMERICAL, f"rows {rows}: fewer than min(2048, seq_len) indices", metrics={"count_ok": False})
    if width == 0 or batch == 0:
        return Verdict(PASSED, "", 0.0, 0.0, {})
    # Reachability: every selected id is a token of that row's sequence.
    big = torch.iinfo(torch.long).max
    sorted_ids, perm = torch.where(token_ids >= 0, token_ids, torch.full_like(token_ids, big)).sort(dim=1)
    q = torch.where(want, ids, torch.zeros_like(ids))
    loc = torch.searchsorted(sorted_ids, q.contiguous()).clamp(max=width - 1)
    found = sorted_ids.gather(1, loc) == q
    if bool((~found & want).any()):
        rows = sorted({int(r) for r in torch.nonzero(~found & want)[:, 0].tolist()})[:5]
        return Verdict(INCORRECT_NUMERICAL, f"rows {rows}: an index is not a token of its sequence (unreachable)",
                       metrics={"reachable": False})
    # No duplicates (padding replaced by distinct negative sentinels).
    uniq = torch.where(want, ids, -(slot[None, :] + 2).expand(batch, -1)).sort(dim=1).values
    if bool((uniq[:, 1:] == uniq[:, :-1]).any()):
        rows = sorted({int(r) for r in torch.nonzero(uniq[:, 1:] == uniq[:, :-1])[:, 0].tolist()})[:5]
        return Verdict(INCORRECT_NUMERICAL, f"rows {rows}: duplicate indices", metrics={"duplicates": True})
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
        rows = sorted({int(r) for r in torch.nonzero(exceed)[:, 0].tolist()})[:5]
        return Verdict(INCORRECT_NUMERICAL, f"rows {rows}: selected tokens' sorted scores differ from the reference's "
                                            f"top scores (max err {max_rel:.3g} of the row max)", max_abs, max_rel, metrics)
    return Verdict(PASSED, "", max_abs, max_rel, metrics)


_CHECKERS = {DSA_INDEXER: _check_indexer, DSA_SPARSE: _check_sparse_attention}
