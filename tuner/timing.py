"""GPU timing of one (variant, workload): CUDA-graph replay of rotated input sets, and eager time.

Timing protocol, `measure`:

1. Input sets. The workload's inputs are replicated into `n` sets that differ only in the input
   the definition's spec rotates (`Spec.rotation`, e.g. a copy of the GDN state per set, a page
   shift of the DSA block table or sparse indices, MoE experts rolled within their groups):
   enough sets that the bytes the sets make a call read from HBM (`Rotation.set_bytes`) exceed 4x
   the L2, so no set is still cache-resident when its turn comes (as in serving, where the other
   layers run in between), capped at 256 sets (32 with --quick), at the rotation's own cap, and,
   when every set copies the input (an input updated in place), at 8 GiB of copies.
2. Eager time: host + device wall time of single synchronised calls, median and 10th / 90th
   percentile (serving often runs prefill eagerly, and host overhead is real). `kdispatch bench`
   (and `tune --eager-turns`) takes it for all of a workload's timed variants together, in turns
   (`eager_in_turns`, see tuner/job.py), after `measure` has probed each with a few calls.
3. Device time, the number routing uses:
   - eager median >= SLOW_US: CUDA events around single calls (launch gaps are noise at that size):
     method "events"; likewise a reference the spec marks as not graph-safe (it syncs with the host);
   - else one CUDA graph calls the variant once per input set (as many sets as `graph_sets` keeps:
     about 0.05 s of device time and 0.25 s of host time at most); the outputs of the last call are
     poisoned (NaN / a sentinel) and one replay must overwrite them (an input updated in place must
     change instead): kernels launched outside the capture (side streams, some JIT runtimes) would
     otherwise "time" nothing. Then `reps` replays, each timed with CUDA events, per call =
     replay time / n; method "graph". A capture that raises, or work that escapes it, falls back to
     events ("events:capture-failed" / "events:work-escaped"; such a variant is never routed to,
     it would crash or do nothing under graph capture).
   Median, 10th and 90th percentile over the repetitions are recorded. Repetitions adapt to the
   time of one replay (about 0.05 s of replays per measurement, 3..100 reps; --quick 0.03 s, 3..10).
   Each replay already averages one call per input set, so few replays suffice: over the 20,901 graph
   rows an H100 measured with 0.2 s of replays (2026-11-27) the p10..p90 spread was 0.5% of the
   median at the median row and 2% at the 90th percentile, well inside the fitter's 3% min_gain;
   the replays were ~70% of a measurement's time.

On the CPU (tests) the same protocol runs with wall-clock time only (method "cpu").
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from kdispatch import definitions as defs

from . import gate
from .stats import percentile

L2_MULTIPLE = 4
MAX_SETS, MAX_SETS_QUICK = 256, 32
MAX_SET_BYTES = 8 << 30  # never clone more than this for rotation
# At and above: events timing, no graph. High on purpose: a host-heavy library call (fla-core spends
# ~1 ms of Python per call on a 30 us kernel) must still be graph-timed, as serving replays it, and
# be compared with a graph-timed baseline; `capture_s` bounds what a capture costs.
SLOW_US = 20000.0


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
    eager_p10_us: float | None = None
    eager_p90_us: float | None = None


@dataclass
class Budget:
    """How hard to measure. `quick` is the smoke-run setting."""

    trials: int = 3
    target_s: float = 0.05  # of graph replays per measurement (a replay = one call per input set)
    min_reps: int = 3  # long replays (many sets x a long call) average hundreds of calls each already
    max_reps: int = 100
    eager_target_s: float = 0.05
    eager_min: int = 5
    eager_max: int = 50
    max_sets: int = MAX_SETS
    capture_s: float = 0.25  # of eager calls in one capture (its host cost: host-heavy variants)
    replay_call_s: float = 0.05  # of device time in one replay's calls (`graph_sets`)

    @classmethod
    def quick(cls) -> "Budget":
        return cls(trials=1, target_s=0.03, min_reps=3, max_reps=10, eager_target_s=0.01, eager_min=3,
                   eager_max=10, max_sets=MAX_SETS_QUICK)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_of(args) -> torch.device:
    return next(a.device for a in args if isinstance(a, torch.Tensor))


# ----------------------------------------------------------------------------------------------
# Input rotation
# ----------------------------------------------------------------------------------------------

def set_bytes(definition: str, args) -> int:
    """Bytes of HBM one call reads that differ between rotated sets (the L2-relevant working set)."""
    d = defs.get(definition)
    rot = d.spec.rotation
    return 0 if rot is None else int(rot.set_bytes(dict(zip(d.inputs, args))))


def num_sets(definition: str, args, l2_bytes: int, max_sets: int = MAX_SETS) -> int:
    d = defs.get(definition)
    rot = d.spec.rotation
    if rot is None:
        return 1
    per = max(1, set_bytes(d.name, args))
    n = math.ceil(L2_MULTIPLE * l2_bytes / per) if l2_bytes else 1
    if rot.input in d.spec.in_place.values():  # every set holds a copy
        n = min(n, MAX_SET_BYTES // per)
    if rot.max_sets is not None:
        n = min(n, rot.max_sets)
    return int(max(1, min(n, max_sets)))


def rotate(definition: str, args, i: int, n: int) -> list:
    """Input set i of n. Sets share every input but the rotated one; an input updated in place
    is made anew for every set, set 0 included, so timing never writes into `args`."""
    d = defs.get(definition)
    rot = d.spec.rotation
    out = list(args)
    if rot is None or (i == 0 and rot.input not in d.spec.in_place.values()):
        return out
    out[d.inputs.index(rot.input)] = rot.make(dict(zip(d.inputs, args)), i, n)
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


def eager_rounds_us(fns: dict[str, Callable], sets: list, rounds: int) -> dict[str, list[float]]:
    """Eager times (host + device wall time of single synchronised calls, µs) of several callables on
    one workload's input sets, taking turns call by call: each round calls every one once, in an
    order shuffled round to round (seeded), and every call takes the next input set (none finds the
    set of the call before it in the L2). The host's speed drifts over seconds (its clock, other
    processes), so variants timed one after another can differ by the spell each fell in (the eight
    configurations of one CUDA decode kernel, one host path, 17% apart per workload at the median
    and 53% at the 90th percentile; 7% and 13% in turns: benchmarks/results/eager-turns-H200.txt);
    taking turns puts every one in every spell. Shuffled, since a call finds the host's caches warm
    with whatever ran before it: in a fixed cyclic order each configuration followed its sibling
    (the same code, warm) while the routed op followed another variant, and the op's cost over its
    variant's direct call read +7-17 us instead of +3-4 (benchmarks/results/eager-protocol-H200.txt)."""
    names = list(fns)
    device = _device_of(sets[0])
    out: dict[str, list[float]] = {n: [] for n in names}
    calls = 0
    for r in range(rounds):
        order = list(names)
        random.Random(r).shuffle(order)
        for n in order:
            s = sets[calls % len(sets)]
            calls += 1
            _sync(device)
            t0 = time.perf_counter()
            fns[n](*s)
            _sync(device)
            out[n].append((time.perf_counter() - t0) * 1e6)
    return out


def eager_in_turns(definition: str, fns: dict[str, Callable], args, budget: Budget, l2_bytes: int,
                   first: dict[str, float]) -> dict[str, list[float]]:
    """name -> eager µs of each round's call of the callables (each already run on these inputs),
    timed in turns (`eager_rounds_us`) on rotated input sets: about `eager_target_s` of calls each by
    their first estimates `first` (µs), within `eager_min`..`eager_max` rounds."""
    args = gate.private_copy(definition, args)
    sets = input_sets(definition, args, l2_bytes, budget.max_sets)
    mean = sum(first.values()) / max(len(first), 1)
    rounds = int(min(budget.eager_max, max(budget.eager_min, budget.eager_target_s * 1e6 // max(mean, 1.0))))
    with torch.no_grad():
        for fn in fns.values():  # each one's first call on these sets, outside the timer (as in `measure`)
            fn(*sets[0])
        return eager_rounds_us(fns, sets, rounds)


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


def _end_generator_capture(device) -> None:
    """After a capture that raised: torch's CUDA generators stay marked as capturing (the capture's
    end failed before releasing them), and any later random draw on the device in this process raises
    "Offset increment outside graph capture". A capture that completes releases them; it records one
    small op so that it is not empty. The caller re-raises the capture's own error."""
    try:
        scratch = torch.zeros(1, device=device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            scratch.add_(1)
    except Exception:  # the context is gone: the caller's health check says so
        pass


def graph_times_us(fn: Callable, sets: list, reps: int | None = None, target_s: float = 0.05,
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
    try:
        with torch.cuda.graph(g):
            rets = [fn(*s) for s in sets]
    except Exception:
        _end_generator_capture(device)
        raise
    try:
        # The captured work must happen on replay: fresh outputs are poisoned and must be
        # overwritten; outputs that alias an input (in-place state) are zeroed and some must be
        # written, then restored. (Not "must change": a call whose outputs depend on its inputs only,
        # a prefill of fresh sequences, writes on replay the values the warm-up calls left there.)
        fresh, inplace = [], []
        for t in _outputs(rets[-1]):
            if t.numel() == 0:
                continue
            if _aliases_input(t, sets[-1]):
                inplace.append((t, t.clone()))
                t.zero_()
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
        if not fresh and inplace and not any(bool(t.any()) for t, _ in inplace):
            raise WorkEscaped("a replay wrote nothing into the in-place outputs")
        for t, before in inplace:
            t.copy_(before)
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


def screen_us(fn: Callable, args, graph: bool = True) -> tuple[float | None, float]:
    """A rough (graph, eager) time of one call, in µs: the same input set over and over (cache-warm),
    a handful of calls. Enough to tell a variant several times slower than the fastest on a workload
    from the rest (`tuner/job.py`, screening), never to route on. Graph: None where the call could
    not be captured (such a variant is not routed to in graphs anyway), or is not tried (`graph`
    False: a reference the spec marks as host-synchronising, as `measure`). The caller passes inputs
    it may overwrite (in-place state) and has made the first call (compiles) already."""
    device = _device_of(args)
    with torch.no_grad():
        eager = min(eager_times_us(fn, [args], 2))
        if device.type != "cuda":
            return eager, eager
        if not graph:
            return None, eager
        try:
            times, _ = graph_times_us(fn, [args], reps=3)
        except Exception:
            if not gate.healthy(device):
                raise
            return None, eager
    return min(times), eager


def graph_sets(n: int, eager_us: float, device_us: float, budget: Budget) -> int:
    """How many of a workload's n input sets one captured replay calls: at most about `capture_s` of
    eager calls (the capture pays each call's host time: a safety net for host-heavy variants) and
    `replay_call_s` of device time, at least 2. The device cut binds only where the n sets (those
    that make 4 x L2, `num_sets`) would take longer: then one set's bytes are under
    4 x L2 x device_us / replay_call_s, so a set still cache-resident when its turn comes saves a
    call at most 4 x L2 / (HBM bandwidth x replay_call_s) of its time, 0.12% on an H100 (50 MB,
    3.35 TB/s), while the sets of long calls made replays of 0.1-1 s, each paid at least
    `min_reps` + 2 times (H100 rows of 2026-11-27: 1,448 such rows, a quarter of the prefills' replay
    seconds)."""
    keep = min(n, int(budget.capture_s * 1e6 / max(eager_us, 1.0)), int(budget.replay_call_s * 1e6 / max(device_us, 1.0)))
    return min(n, max(2, keep))


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
                          len(eager), "", percentile(eager, 0.1), percentile(eager, 0.9))
        note, method = "", "graph"
        times = None
        if not graph:
            method, note = "events", "host-synchronising variant: timed with events, not captured"
        elif eager_med < SLOW_US:
            device_us = min(event_times_us(fn, sets, 1))
            sets = sets[:graph_sets(len(sets), eager_med, device_us, budget)]
            try:
                times, reps = graph_times_us(fn, sets, None, budget.target_s, budget.min_reps, budget.max_reps)
            except WorkEscaped as exc:
                method, note = "events:work-escaped", f"CUDA graph: {exc}"
            except Exception as exc:  # capture raised (a sync inside, an unsupported call, ...)
                if not gate.healthy(device):
                    raise gate.ContextLost(f"CUDA graph capture: {type(exc).__name__}: {exc}") from exc
                method, note = "events:capture-failed", f"CUDA graph capture failed: {type(exc).__name__}: {exc}"[:300]
        else:
            method = "events"
        if times is None:
            reps = int(min(20, max(3, math.ceil(2 * budget.target_s * 1e6 / max(eager_med, 1.0)))))
            times = event_times_us(fn, sets, reps)
    return Timing(method, statistics.median(times), percentile(times, 0.1), percentile(times, 0.9), eager_med,
                  len(sets), len(times), note, percentile(eager, 0.1), percentile(eager, 0.9))
