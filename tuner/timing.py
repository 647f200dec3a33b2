"""GPU timing, and the job a tuning worker runs (materialise -> gate -> time, per workload).

Timing protocol for one (variant, workload), `measure`:

1. Input sets. The workload's inputs are replicated into `n` sets that differ only in the input
   named in `ROTATION` (one table): enough sets that the bytes the sets make a call read from HBM
   exceed 4x the L2, so no set is still cache-resident when its turn comes (as in serving, where
   the other layers run in between), capped at 256 sets (32 with --quick):
     GDN decode/prefill  `state`: one copy per set (B x 512 KB each);
     DSA indexer         `block_table`: page ids shifted by i * num_pages / n (mod num_pages), so
                         set i reads other pages of the same pool (cheaper than copying the pool);
     DSA sparse attn.    `sparse_indices`: the same page shift, applied to every valid index;
     MoE                 `routing_logits`: experts rolled by i inside each group of 32, so each set
                         routes to other local experts (the 44 MB of one expert's weights would
                         otherwise stay in the 50 MB L2 at small seq_len); at most 8 sets.
2. Eager time: host + device wall time of single synchronised calls, median (serving often runs
   prefill eagerly, and host overhead is real).
3. Device time, the number routing uses:
   - eager median >= 1 ms: CUDA events around single calls (launch gaps are noise at that size;
     the MoE reference, which syncs inside, cannot be captured anyway): method "events";
   - else one CUDA graph calls the variant once per input set; the outputs of the last call are
     poisoned (NaN / a sentinel) and one replay must overwrite them (an input updated in place must
     change instead): kernels launched outside the capture (side streams, some JIT runtimes) would
     otherwise "time" nothing. Then `reps` replays, each timed with CUDA events, per call =
     replay time / n; method "graph". A capture that raises, or work that escapes it, falls back to
     events ("events:capture-failed" / "events:work-escaped"; such a variant is never routed to,
     it would crash or do nothing under graph capture).
   Median, 10th and 90th percentile over the repetitions are recorded. Repetitions adapt to the
   time of one replay (about 0.2 s of replays per measurement, 3..100 reps; --quick 0.03 s, 3..10).

On the CPU (tests) the same protocol runs with wall-clock time only (method "cpu").
"""
from __future__ import annotations

import datetime
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from kdispatch import definitions as defs
from kdispatch import registry

from . import gate

L2_MULTIPLE = 4
MAX_SETS, MAX_SETS_QUICK = 256, 32
MAX_SET_BYTES = 8 << 30  # never clone more than this for rotation
# At and above: events timing, no graph. High on purpose: a host-heavy library call (fla-core spends
# ~1 ms of Python per call on a 30 us kernel) must still be graph-timed, as serving replays it, and
# be compared with a graph-timed baseline; `capture_s` bounds what a capture costs.
SLOW_US = 20000.0
MOE_EXPERT_BYTES = 4096 * 7168 + 7168 * 2048 + (32 * 56 + 56 * 16) * 4

GDN_DECODE, GDN_PREFILL = gate.GDN_DECODE, gate.GDN_PREFILL
DSA_INDEXER, DSA_SPARSE, MOE_FP8 = gate.DSA_INDEXER, gate.DSA_SPARSE, gate.MOE_FP8


@dataclass
class Timing:
    method: str
    median_us: float
    p10_us: float
    p90_us: float
    eager_us: float | None
    sets: int
    reps: int
    note: str = ""


@dataclass
class Budget:
    """How hard to measure. `quick` is the smoke-run setting."""

    trials: int = 3
    target_s: float = 0.2  # of graph replays per measurement (a replay = one call per input set)
    min_reps: int = 3  # long replays (many sets x a long call) average hundreds of calls each already
    max_reps: int = 100
    eager_target_s: float = 0.05
    eager_min: int = 5
    eager_max: int = 50
    max_sets: int = MAX_SETS
    capture_s: float = 0.25

    @classmethod
    def quick(cls) -> "Budget":
        return cls(trials=1, target_s=0.03, min_reps=3, max_reps=10, eager_target_s=0.01, eager_min=3,
                   eager_max=10, max_sets=MAX_SETS_QUICK)


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_of(args) -> torch.device:
    return next(a.device for a in args if isinstance(a, torch.Tensor))


# ----------------------------------------------------------------------------------------------
# Input rotation
# ----------------------------------------------------------------------------------------------

ROTATION = {GDN_DECODE: "state", GDN_PREFILL: "state", DSA_INDEXER: "block_table",
            DSA_SPARSE: "sparse_indices", MOE_FP8: "routing_logits"}


def set_bytes(definition: str, args) -> int:
    """Bytes of HBM one call reads that differ between rotated sets (the L2-relevant working set)."""
    definition = defs.resolve_name(definition)
    names = gate.input_names(definition)
    a = dict(zip(names, args))
    if definition in (GDN_DECODE, GDN_PREFILL):
        return a["state"].numel() * a["state"].element_size()
    if definition == DSA_INDEXER:
        pages = int(((a["seq_lens"].to(torch.long) + 63) // 64).sum())
        return pages * a["k_index_cache_fp8"].shape[1] * a["k_index_cache_fp8"].shape[3]
    if definition == DSA_SPARSE:
        per_token = (a["ckv_cache"].shape[-1] + a["kpe_cache"].shape[-1]) * a["ckv_cache"].element_size()
        return int((a["sparse_indices"] >= 0).sum()) * per_token
    if definition == MOE_FP8:
        from kdispatch.references.moe_fp8 import _route

        experts, _ = _route(a["routing_logits"], a["routing_bias"], a["routed_scaling_factor"])
        off = int(a["local_expert_offset"])
        local = experts[(experts >= off) & (experts < off + a["gemm1_weights"].shape[0])]
        return max(1, int(torch.unique(local).numel())) * MOE_EXPERT_BYTES
    return 0


def num_sets(definition: str, args, l2_bytes: int, max_sets: int = MAX_SETS) -> int:
    definition = defs.resolve_name(definition)
    if definition not in ROTATION:
        return 1
    per = max(1, set_bytes(definition, args))
    n = math.ceil(L2_MULTIPLE * l2_bytes / per) if l2_bytes else 1
    if definition in (GDN_DECODE, GDN_PREFILL):
        n = min(n, MAX_SET_BYTES // per)
    if definition == MOE_FP8:
        n = min(n, 8)
    return int(max(1, min(n, max_sets)))


def rotate(definition: str, args, i: int, n: int) -> list:
    """Input set i of n. Sets share every input but the rotated one; an input updated in place
    (the GDN state) is copied for every set, set 0 included, so timing never writes into `args`."""
    definition = defs.resolve_name(definition)
    if definition not in ROTATION:
        return list(args)
    names = gate.input_names(definition)
    k = names.index(ROTATION[definition])
    out = list(args)
    x = args[k]
    if definition in (GDN_DECODE, GDN_PREFILL):
        out[k] = x.clone()
    elif i == 0:
        pass
    elif definition == DSA_INDEXER:
        num_pages = args[names.index("k_index_cache_fp8")].shape[0]
        shift = i * max(1, num_pages // n)
        out[k] = ((x.to(torch.long) + shift) % num_pages).to(x.dtype)
    elif definition == DSA_SPARSE:
        num_pages, page = args[names.index("ckv_cache")].shape[:2]
        shift = i * max(1, num_pages // n)
        xl = x.to(torch.long)
        moved = ((xl // page + shift) % num_pages) * page + xl % page
        out[k] = torch.where(xl >= 0, moved, xl).to(x.dtype)
    elif definition == MOE_FP8:
        t, e = x.shape
        out[k] = x.view(t, 8, e // 8).roll(i, dims=2).reshape(t, e).contiguous()
    return out


def input_sets(definition: str, args, l2_bytes: int, max_sets: int = MAX_SETS) -> list[list]:
    n = num_sets(definition, args, l2_bytes, max_sets)
    return [rotate(definition, args, i, n) for i in range(n)]


# ----------------------------------------------------------------------------------------------
# Timers
# ----------------------------------------------------------------------------------------------

def eager_times_us(fn: Callable, sets: list, reps: int) -> list[float]:
    """Host + device wall time of single synchronised calls (µs)."""
    device = _device_of(sets[0])
    times = []
    for i in range(reps):
        s = sets[i % len(sets)]
        _sync(device)
        t0 = time.perf_counter()
        fn(*s)
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def event_times_us(fn: Callable, sets: list, reps: int) -> list[float]:
    """Device time of single eager calls between CUDA events (µs)."""
    times = []
    for i in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn(*sets[i % len(sets)])
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    return times


def _outputs(ret) -> list[torch.Tensor]:
    if isinstance(ret, torch.Tensor):
        return [ret]
    if isinstance(ret, (tuple, list)):
        return [t for t in ret if isinstance(t, torch.Tensor)]
    return []


def _aliases_input(t: torch.Tensor, args) -> bool:
    p = t.untyped_storage().data_ptr()
    return any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == p for a in args)


class WorkEscaped(RuntimeError):
    pass


def graph_times_us(fn: Callable, sets: list, reps: int | None = None, target_s: float = 0.2,
                   min_reps: int = 3, max_reps: int = 100) -> tuple[list[float], int]:
    """Per-call times (µs) of `reps` replays of one CUDA graph calling fn once per input set.

    Raises WorkEscaped when a replay does not write the captured outputs. Returns (times, reps)."""
    device = _device_of(sets[0])
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm up off the capture stream, as torch.cuda.graphs recommends
        for s in sets[:2]:
            fn(*s)
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        rets = [fn(*s) for s in sets]
    try:
        # The captured work must happen on replay: fresh outputs are poisoned and must be
        # overwritten; outputs that alias an input (in-place state) must change.
        fresh, inplace = [], []
        for t in _outputs(rets[-1]):
            if t.numel() == 0:
                continue
            if _aliases_input(t, sets[-1]):
                inplace.append((t, t.clone()))
            else:
                fresh.append(t)
                t.fill_(float("nan") if t.is_floating_point() else -(2 ** 31) + 7)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        first_s = e0.elapsed_time(e1) / 1e3
        for t in fresh:
            poisoned = torch.isnan(t) if t.is_floating_point() else t == -(2 ** 31) + 7
            if bool(poisoned.any()):
                raise WorkEscaped(f"a replay left {int(poisoned.sum())} of {t.numel()} output elements unwritten")
        if not fresh and inplace and all(torch.equal(t, before) for t, before in inplace):
            raise WorkEscaped("a replay did not change the in-place outputs")
        if first_s <= 0:
            raise WorkEscaped("a replay took no time")
        if reps is None:
            reps = int(min(max_reps, max(min_reps, math.ceil(target_s / max(first_s, 1e-6)))))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        g.replay()  # warm
        for a, b in events:
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize(device)
        return [a.elapsed_time(b) * 1e3 / len(sets) for a, b in events], reps
    finally:
        del rets
        g.reset()


# Variants that synchronise with the host inside (data-dependent Python control flow), so a CUDA
# graph capture would raise: they are timed with events without trying (a failed capture is
# recoverable, but not worth the risk on every workload). Only references, never routed to.
NO_GRAPH = {(MOE_FP8, "reference"), (GDN_PREFILL, "reference")}


def measure(definition: str, fn: Callable, args, budget: Budget | None = None, l2_bytes: int | None = None,
            graph: bool = True) -> Timing:
    """Times one variant on one workload's inputs (see the module docstring)."""
    budget = budget or Budget()
    device = _device_of(args)
    if l2_bytes is None:
        l2_bytes = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
    args = gate.private_copy(definition, args)  # the caller's inputs (the gate's trials) stay untouched
    sets = input_sets(definition, args, l2_bytes, budget.max_sets)
    with torch.no_grad():
        fn(*sets[0])  # compile / first-call work outside every timer
        _sync(device)
        probe = eager_times_us(fn, sets, 2)
        est = min(probe)
        eager = eager_times_us(fn, sets, int(min(budget.eager_max, max(budget.eager_min,
                                                                       budget.eager_target_s * 1e6 // max(est, 1.0)))))
        eager_med = statistics.median(eager)
        if device.type != "cuda":
            return Timing("cpu", eager_med, percentile(eager, 0.1), percentile(eager, 0.9), eager_med, len(sets),
                          len(eager))
        note, method = "", "graph"
        times = None
        if not graph:
            method, note = "events", "host-synchronising variant: timed with events, not captured"
        elif eager_med < SLOW_US:
            # A safety net for host-heavy variants (many kernels per call): capture at most about
            # `capture_s` of eager calls.
            sets = sets[:max(2, min(len(sets), int(budget.capture_s * 1e6 / max(eager_med, 1.0))))]
            try:
                times, reps = graph_times_us(fn, sets, None, budget.target_s, budget.min_reps, budget.max_reps)
            except WorkEscaped as exc:
                method, note = "events:work-escaped", f"CUDA graph: {exc}"
            except Exception as exc:  # capture raised (a sync inside, an unsupported call, ...)
                if not gate._healthy(device):
                    raise gate.ContextLost(f"CUDA graph capture: {type(exc).__name__}: {exc}") from exc
                method, note = "events:capture-failed", f"CUDA graph capture failed: {type(exc).__name__}: {exc}"[:300]
        else:
            method = "events"
        if times is None:
            reps = int(min(20, max(3, math.ceil(2 * budget.target_s * 1e6 / max(eager_med, 1.0)))))
            times = event_times_us(fn, sets, reps)
    return Timing(method, statistics.median(times), percentile(times, 0.1), percentile(times, 0.9), eager_med,
                  len(sets), len(times), note)


# ----------------------------------------------------------------------------------------------
# The worker's job: one definition, some workloads, the variants pending on each
# ----------------------------------------------------------------------------------------------

@dataclass
class Job:
    """Picklable unit of work. `workloads`: [{"uuid", "axes", "inputs"}]; `pending`: uuid ->
    variant names to measure there ("routed" = the kdispatch op through its router)."""

    definition: str
    workloads: list[dict]
    pending: dict[str, list[str]]
    device: str = "cuda:0"
    trace_root: str | None = None
    quick: bool = False
    trials: int | None = None
    executor: str = "kdispatch.tuner.timing:run_job"
    job_id: int = 0
    extra: dict = field(default_factory=dict)

    def items(self) -> int:
        return sum(len(v) for v in self.pending.values())


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_fn(definition: str, name: str) -> Callable:
    if name == "routed":
        import kdispatch.ops

        return kdispatch.ops.DISPATCHERS[defs.FULL_TO_SHORT[defs.resolve_name(definition)]]
    return registry.get(definition, name).fn


def run_job(job: Job, emit: Callable) -> None:
    """Measures every pending (variant, workload) of the job; emits ("start", name, uuid) before and
    ("result", row dict) after each. Raises gate.ContextLost after emitting the row whose error
    broke the CUDA context (the caller exits the worker)."""
    from kdispatch.workloads import materialize

    budget = Budget.quick() if job.quick else Budget()
    trials_n = job.trials or budget.trials
    device = torch.device(job.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
    definition = defs.resolve_name(job.definition)
    registry.discover()
    for w in job.workloads:
        names = job.pending.get(w["uuid"], [])
        if not names:
            continue
        emit("start", None, w["uuid"])
        try:
            trials = []
            for t in range(trials_n):
                args = list(materialize(definition, gate.trial_workload(w, t), device=device, seed=0,
                                        trace_root=job.trace_root))
                trials.append((args, gate.reference(definition, args)))
        except Exception as exc:
            msg = f"inputs or reference failed: {type(exc).__name__}: {exc}"[:500]
            for name in names:
                emit("result", _row(name, w, gate.Verdict(gate.RUNTIME_ERROR, msg)))
            if not gate._healthy(device):
                raise gate.ContextLost(msg) from exc
            continue
        for name in names:
            emit("start", name, w["uuid"])
            try:
                fn = resolve_fn(definition, name)
            except Exception as exc:
                emit("result", _row(name, w, gate.Verdict(gate.RUNTIME_ERROR, f"cannot load: {exc}"[:500])))
                continue
            extra = {}
            if name == "routed":
                from kdispatch import arch as _arch

                extra["routed_to"] = fn.choose(_arch.arch_of(device), dict(w["axes"])).name
            try:
                verdict = gate.run_gate(definition, fn, trials)
            except gate.ContextLost as exc:
                emit("result", _row(name, w, gate.Verdict(gate.RUNTIME_ERROR, f"{exc} (CUDA context lost)"[:500])))
                raise
            timing = None
            if verdict.passed:
                try:
                    timing = measure(definition, fn, trials[0][0], budget, l2, graph=(definition, name) not in NO_GRAPH)
                except gate.ContextLost as exc:
                    emit("result", _row(name, w, gate.Verdict(gate.RUNTIME_ERROR, f"timing: {exc} (CUDA context lost)"[:500])))
                    raise
                except Exception as exc:
                    verdict = gate.Verdict(gate.RUNTIME_ERROR, f"timing failed: {type(exc).__name__}: {exc}"[:500],
                                           verdict.max_abs_err, verdict.max_rel_err, verdict.metrics)
            verdict.metrics.update(extra)
            emit("result", _row(name, w, verdict, timing))
        del trials
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _row(name: str, w: dict, v: gate.Verdict, t: Timing | None = None) -> dict:
    row = {"variant": name, "uuid": w["uuid"], "axes": dict(w["axes"]), "status": v.status, "reason": v.reason,
           "max_abs_err": v.max_abs_err, "max_rel_err": v.max_rel_err, "metrics": dict(v.metrics),
           "measured_at": now()}
    if t is not None:
        row.update(method=t.method, median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us, eager_us=t.eager_us,
                   sets=t.sets, reps=t.reps)
        if t.note:
            row["reason"] = (row["reason"] + "; " if row["reason"] else "") + t.note
    return row


def worker_pid() -> int:
    return os.getpid()
