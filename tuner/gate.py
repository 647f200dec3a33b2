"""Correctness gate: is a variant's output right for this workload? FlashInfer-Bench semantics.

For each of several trials (fresh inputs: the workload materialised under a derived uuid, so every
per-call tensor differs while the shared cache pools and MoE weights stay, as in serving), the
variant is called on private copies of the inputs (inputs the spec lists as `shared` are not
copied) and compared with the definition's reference (computed in float32) on the same inputs:

- an exception, or outputs of the wrong number, shape or dtype, fail (RUNTIME_ERROR,
  INCORRECT_SHAPE, INCORRECT_DTYPE);
- value-returning variants cannot have their outputs poisoned, so the CUDA caching allocator is:
  blocks the size of each output are filled with 0x7F bytes (a huge finite float, a NaN in FP8,
  an unreachable index in int32) and freed just before the call, so an output element a kernel
  forgets to write is very likely garbage rather than a lucky zero (best effort: the allocator
  may hand out other blocks);
- an output the spec lists as `in_place` must be the input it names, itself (the in-place contract);
- the outputs are then compared by the spec's `check`, or elementwise with its tolerances
  (kdispatch/checks.py: NaN or Inf where the reference is finite always fails).

Everything here is generic over the definition's spec and runs on CPU tensors too (the tests).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from kdispatch import definitions as defs
from kdispatch import registry
from kdispatch.checks import (INCORRECT_DTYPE, INCORRECT_NUMERICAL, INCORRECT_SHAPE, PASSED, RUNTIME_ERROR,
                              Verdict, combine, compare, worse)

POISON_BYTE = 0x7F


@dataclass
class Reference:
    """What one trial is checked against: the reference outputs and the spec's extra facts."""

    outputs: tuple
    extra: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# Inputs and the reference
# ----------------------------------------------------------------------------------------------

def private_copy(definition: str, args) -> list:
    """The arguments with every tensor copied, except the spec's shared pools/weights."""
    d = defs.get(definition)
    return [a.clone() if isinstance(a, torch.Tensor) and n not in d.spec.shared else a
            for n, a in zip(d.inputs, args)]


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
    """Runs the reference on copies of `args` (float32 math inside), or its faster, float64 oracle
    where it has one (kdispatch/references/oracles.py), plus the spec's extras."""
    from kdispatch.references.oracles import ORACLES

    d = defs.get(definition)
    run = ORACLES.get(d.name) or registry.get(d.name, registry.REFERENCE).fn
    with torch.no_grad():
        out = as_tuple(run(*private_copy(d.name, args)), len(d.outputs))
    extra = d.spec.reference_extra(dict(zip(d.inputs, args))) if d.spec.reference_extra else {}
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


def healthy(device: torch.device) -> bool:
    """Is the CUDA context still usable (after a variant raised)?"""
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
    d = defs.get(definition)
    worst_abs, worst_rel, metrics = 0.0, 0.0, {}
    for t, (args, ref) in enumerate(trials):
        call_args = private_copy(d.name, args)
        device = next(a.device for a in call_args if isinstance(a, torch.Tensor))
        poison_allocator([o.numel() * o.element_size() for o in ref.outputs], device)
        try:
            with torch.no_grad():
                raw = fn(*call_args)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:
            msg = f"trial {t}: {type(exc).__name__}: {exc}"[:500]
            if not healthy(device):
                raise ContextLost(msg) from exc
            return Verdict(RUNTIME_ERROR, msg)
        out = as_tuple(raw, len(d.outputs))
        if out is None or not all(isinstance(o, torch.Tensor) for o in out):
            return Verdict(INCORRECT_SHAPE, f"trial {t}: expected {len(d.outputs)} tensor output(s) {d.outputs}, "
                                            f"got {type(raw).__name__}")
        for name, o, r in zip(d.outputs, out, ref.outputs):
            if tuple(o.shape) != tuple(r.shape):
                return Verdict(INCORRECT_SHAPE, f"trial {t}: {name} has shape {tuple(o.shape)}, expected {tuple(r.shape)}")
            if o.dtype != r.dtype:
                return Verdict(INCORRECT_DTYPE, f"trial {t}: {name} has dtype {o.dtype}, expected {r.dtype}")
        for oname, iname in (d.spec.in_place.items() if check_in_place else ()):
            if out[d.outputs.index(oname)] is not call_args[d.inputs.index(iname)]:
                return Verdict(INCORRECT_NUMERICAL, f"trial {t}: {oname} is not the {iname!r} argument "
                                                    "(the in-place contract)", metrics={"in_place": False})
        v = check_outputs(d.name, call_args, out, ref)
        v.reason = f"trial {t}: {v.reason}" if v.reason else ""
        worst_abs = worse(worst_abs, v.max_abs_err)
        worst_rel = worse(worst_rel, v.max_rel_err)
        for k, x in v.metrics.items():
            metrics[k] = x if k not in metrics else _worse_metric(k, metrics[k], x)
        if not v.passed:
            v.max_abs_err, v.max_rel_err, v.metrics = worst_abs, worst_rel, metrics
            return v
    return Verdict(PASSED, "", worst_abs, worst_rel, {**metrics, "trials": len(trials)})


def _worse_metric(key: str, a, b):
    """Aggregate a metric over trials: the minimum for ratios that must be high, else the maximum."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return b
    return min(a, b) if "matched" in key else max(a, b)


def check_outputs(definition: str, args, out: tuple, ref: Reference) -> Verdict:
    """The spec's check of one trial's outputs, or elementwise with its tolerances."""
    d = defs.get(definition)
    named_out, named_ref = dict(zip(d.outputs, out)), dict(zip(d.outputs, ref.outputs))
    if d.spec.check is not None:
        return d.spec.check(dict(zip(d.inputs, args)), named_out, named_ref, ref.extra)
    return combine([compare(n, named_out[n], named_ref[n], d.spec.tolerance(n)) for n in d.outputs])
