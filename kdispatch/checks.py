"""Output comparison with FlashInfer-Bench's evaluator semantics: statuses, tolerances, verdicts.

The tuner's correctness gate (tuner/gate.py) calls variants and hands their outputs here; a
definition's spec (kdispatch/definitions/<op_type>/spec.py) picks the tolerances and, where plain
elementwise comparison is not the contract (top-k selections, empty attention rows), its own check
built from these pieces. Everything runs on CPU tensors too.

An element matches when |x - ref| <= atol or |x - ref| <= rtol * |ref| (FlashInfer-Bench's
`compute_error_stats`); at least `matched_ratio` of the elements must match; optionally also
||x - ref|| / ||ref|| <= rel_norm. NaN or Inf where the reference is finite always fails.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

# FlashInfer-Bench `EvaluationStatus` values (tests check they are members of that enum).
PASSED = "PASSED"
INCORRECT_SHAPE = "INCORRECT_SHAPE"
INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
INCORRECT_DTYPE = "INCORRECT_DTYPE"
RUNTIME_ERROR = "RUNTIME_ERROR"
COMPILE_ERROR = "COMPILE_ERROR"
TIMEOUT = "TIMEOUT"
STATUSES = (PASSED, INCORRECT_SHAPE, INCORRECT_NUMERICAL, INCORRECT_DTYPE, RUNTIME_ERROR, COMPILE_ERROR, TIMEOUT)


@dataclass(frozen=True)
class Tol:
    atol: float
    rtol: float
    matched_ratio: float = 1.0  # fraction of elements that must match
    rel_norm: float | None = None  # bound on ||x - ref|| / ||ref|| as well


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


def compare(name: str, x: torch.Tensor, ref: torch.Tensor, tol: Tol) -> Verdict:
    """Elementwise comparison of one output (float32 math), NaN/Inf always failing."""
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


def worse(a, b):
    """The larger of two error figures, where None is unknown and NaN is the worst."""
    if b is None:
        return a
    if a is None or (isinstance(b, float) and math.isnan(b)):
        return b
    return max(a, b)


def combine(verdicts: list[Verdict]) -> Verdict:
    """One verdict for several outputs: the first failure, the worst errors, every metric."""
    out = Verdict(PASSED, "", 0.0, 0.0, {})
    for v in verdicts:
        out.max_abs_err = worse(out.max_abs_err, v.max_abs_err)
        out.max_rel_err = worse(out.max_rel_err, v.max_rel_err)
        out.metrics.update(v.metrics)
        if not v.passed and out.passed:
            out.status, out.reason = v.status, v.reason
    return out


def first_bad(mask: torch.Tensor) -> tuple[int, ...] | None:
    """Index of the first True element of `mask` (row-major), or None: where a value rule breaks."""
    hit = torch.nonzero(mask.reshape(-1))
    if hit.numel() == 0:
        return None
    return tuple(int(i) for i in torch.unravel_index(hit[0, 0], mask.shape))
