"""The job a tuning worker runs: one definition, some workloads, the variants pending on each.

Per workload: materialise the inputs of every trial once (kdispatch.workloads), run the reference
once per trial, then gate (tuner/gate.py) and time (tuner/timing.py) each pending variant. Each
result is emitted as a row dict as soon as it exists, so the parent stores it even if a later
variant crashes the process.

Eager times in turns (`Job.extra["eager_turns"]`: `kdispatch bench`, which measures every variant
and the routed op of a workload together, and `kdispatch tune --eager-turns`): `measure` only probes each variant's eager time; then
the timed variants take their eager times together, call by call (`timing.eager_in_turns`), and
their rows are emitted. The host's speed drifts over seconds, so variants timed one after another
can differ by the spell each fell in; in turns every one sees every spell, and each call runs after
other code, as in serving, not in a hot loop of its own: benchmarks/results/eager-protocol-H200.txt,
where the library variants' host paths slow the most (FlashInfer's decode 46.6 -> 69.3 us a call,
fla's 104 -> 129, kdispatch's CUDA decode 27.8 -> 29.0; the routed op over its variant's direct
call +2.3 -> +4.1). Where the baseline is not among a workload's pending variants (a tune of new
variants only), its call takes the turns all the same, its row untouched (`_companion`): each new
row is then paired with it, as the eager fit compares them; unpaired, the fit falls back to the two
rows' spreads from different runs, and FlashInfer's wide eager spread kept the contest prefill's
eager router at the baseline on 39 workloads where `cuda_prefill_staged.r32s4` was faster on 37
(H200, 2026-12-01: the held-out eager regret 27.7% mean unpaired, 10.1% once retaken in turns).
`tune --eager-turns-only` runs `retake_eager_job` instead: the turns alone, on rows a tune stored.
A crash then loses the workload's rows timed before it (the restarted worker measures them again);
one during the turns blames no variant. A store's rows are compared across runs, so a definition is
best measured one way throughout (`route` warns where it is not): unless asked, a tune takes a
definition's eager times as most of its stored rows on the GPU took them (tuner/flows.py
`stored_in_turns`), each variant's own loop where it has none. A turn's time still depends on its
companions (colder after more of them): new variants' rows, in turns with the baseline's call alone,
are compared with it round by round, and with the other variants by their medians.

Screening (`Job.extra["screen"]`, a factor: `kdispatch tune --screen`, default tuner/cli.py
SCREEN_FACTOR): every pending variant and the baseline first get a rough time on the workload
(`timing.screen_us`: a few cache-warm calls, graph and eager); a variant over the factor times the
fastest one's in both call modes is neither gated nor timed there. Its row says so (status TIMEOUT,
FlashInfer-Bench's nearest; metrics "screen" with the rough times, `Result.screened`): the fitter
never routes it there, and the held-out regret counts its rough time where a router sends calls to
it. What it saves, estimated from a store's rows measured in full: `benchmarks/tune_time.py
--screen 2` (30% of the gate and timing seconds in the H100 and the H200 stores of 2026-11-28; not
more, as a screened-out variant's first call still compiles).
"""
from __future__ import annotations

import datetime
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from kdispatch import definitions as defs
from kdispatch import provenance, registry
from kdispatch.checks import PASSED, RUNTIME_ERROR, TIMEOUT, Verdict

from . import gate
from .stats import percentile
from .timing import SLOW_US, Budget, Timing, eager_in_turns, measure, screen_us

ROUTED_HINTED = "routed_hinted"  # bench pseudo-variant: the routed op given the workload's call-time hints
STAMP = "%Y-%m-%dT%H:%M:%SZ"  # the store's `measured_at` (ISO, UTC, whole seconds)
EAGER_TURNS = "eager times in turns"  # what a worker is doing after a workload's variants (`_eager_in_turns`)

@dataclass
class Job:
    """Picklable unit of work. `workloads`: [{"uuid", "axes", "inputs", "root"}] (root: the trace set
    that stored inputs' paths are relative to); `pending`: uuid ->
    variant names to measure there ("routed" = the kdispatch op through its router)."""

    definition: str
    workloads: list[dict]
    pending: dict[str, list[str]]
    device: str = "cuda:0"
    quick: bool = False
    trials: int | None = None
    executor: str = "kdispatch.tuner.job:run_job"
    job_id: int = 0
    extra: dict = field(default_factory=dict)

    def items(self) -> int:
        return sum(len(v) for v in self.pending.values())


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime(STAMP)


def resolve_fn(definition: str, name: str, workload: dict | None = None) -> Callable:
    """The callable `name` stands for; the routed pseudo-variants are the op's Dispatcher, given
    `workload`'s call-time hints for ROUTED_HINTED."""
    if name in ("routed", ROUTED_HINTED):
        import functools

        import kdispatch.ops
        from kdispatch.workloads import hint_values

        d = kdispatch.ops.DISPATCHERS[defs.get(definition).short]
        if name == "routed":
            return d
        return functools.partial(d, **hint_values(definition, workload, trace_root=workload.get("root")))
    return registry.get(definition, name).fn


def timed_fn(definition: str, name: str, fn: Callable) -> Callable:
    """What is timed for `name` once `fn` passed the gate: a guarded library baseline's engine call
    (registry: `engine=`), else `fn` itself."""
    if name in ("routed", ROUTED_HINTED):
        return fn
    return registry.get(definition, name).engine_fn or fn


def guarded_times(t) -> dict:
    """A guarded library baseline's own times (what `kdispatch.ops` runs; the row's times are the
    engine's call): the fitter's baseline for the ops' choices (tuner/fit.py, `hand_back`)."""
    return {"median_us": t.median_us, "p10_us": t.p10_us, "p90_us": t.p90_us, "eager_us": t.eager_us,
            "eager_p10_us": t.eager_p10_us, "eager_p90_us": t.eager_p90_us}


def run_job(job: Job, emit: Callable) -> None:
    """Measures every pending (variant, workload) of the job; emits ("start", name, uuid) before and
    ("result", row dict) after each. Raises gate.ContextLost after emitting the row whose error
    broke the CUDA context (the caller exits the worker)."""
    from kdispatch.workloads import materialize

    budget = Budget.quick() if job.quick else Budget()
    trials_n = job.trials or budget.trials
    device = torch.device(job.device)
    in_turns = bool(job.extra.get("eager_turns"))
    probe = replace(budget, eager_min=3, eager_max=3) if in_turns else budget  # what `measure` spends on eager
    if device.type == "cuda":
        torch.cuda.set_device(device)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
    d = defs.get(job.definition)
    definition = d.name
    registry.discover()
    for w in job.workloads:
        names = job.pending.get(w["uuid"], [])
        if not names:
            continue
        emit("start", None, w["uuid"])
        t_inputs = time.perf_counter()
        try:
            trials = []
            for t in range(trials_n):
                args = list(materialize(definition, gate.trial_workload(w, t), device=device, seed=0,
                                        trace_root=w.get("root")))
                trials.append((args, gate.reference(definition, args)))
        except Exception as exc:
            msg = f"inputs or reference failed: {type(exc).__name__}: {exc}"[:500]
            for name in names:
                emit("result", _row(name, w, Verdict(RUNTIME_ERROR, msg)))
            if not gate.healthy(device):
                raise gate.ContextLost(msg) from exc
            continue
        # where a tune's time goes: the workload's inputs + reference trials (shared by its variants),
        # the screen, then per variant the gate and the timing (seconds, in each row's metrics)
        inputs_s = time.perf_counter() - t_inputs
        t_screen = time.perf_counter()
        factor = job.extra.get("screen")
        costs: dict[str, dict] = {}  # the screen's seconds per variant, into its row's metrics
        slow = screen(definition, job.extra.get("baseline"), names, trials[0][0], factor,
                      lambda name: emit("start", name, w["uuid"]), costs) if factor else {}
        screen_s = round(time.perf_counter() - t_screen, 3)
        timed_rows: list[tuple] = []  # (name, verdict, timing, timed callable, guarded callable or None)
        for name in names:
            emit("start", name, w["uuid"])
            if name in slow:
                x = slow[name]
                reason = (f"screened out: {_us(x['graph_us'])} graph, {_us(x['eager_us'])} eager on a cache-warm "
                          f"input, over {factor}x the fastest ({_us(x['best_graph_us'])}, {_us(x['best_eager_us'])});"
                          " not gated, not timed")
                emit("result", _row(name, w, Verdict(TIMEOUT, reason, metrics={
                    "screen": slow[name], "inputs_s": round(inputs_s, 3), "screen_s": screen_s, **costs[name]})))
                continue
            try:
                fn = resolve_fn(definition, name, w)
            except Exception as exc:
                emit("result", _row(name, w, Verdict(RUNTIME_ERROR, f"cannot load: {exc}"[:500])))
                continue
            extra = {}
            if name not in ("routed", ROUTED_HINTED) and registry.get(definition, name).backend == "library":
                # with the code's files, what its hash covers: a machine without these libraries can
                # still tell whether the code changed since (tuner/flows.py `_warn_stale`)
                extra["library_versions"] = provenance.library_versions(registry.get(definition, name).requires)
            if name in ("routed", ROUTED_HINTED):
                from kdispatch import arch as _arch

                op = fn if name == "routed" else fn.func
                # every variable axis, as a call computes them, and the hints the call passes
                axes = {**op.checker.check(trials[0][0]), **({} if name == "routed" else fn.keywords)}
                here = _arch.arch_of(device)
                extra["routed_to"] = op.choose(here, axes).name
                extra["routed_to_eager"] = op.choose(here, axes, "eager").name
                # engine plugins give these calls back to the engine's kernel (tuner/flows.py `regret`)
                extra["hands_back"] = op.hands_back(here, axes)
                extra["hands_back_eager"] = op.hands_back(here, axes, "eager")
            t_gate = time.perf_counter()
            try:
                verdict = gate.run_gate(definition, fn, trials)
            except gate.ContextLost as exc:
                _emit_timed(emit, w, timed_rows)
                emit("result", _row(name, w, Verdict(RUNTIME_ERROR, f"{exc} (CUDA context lost)"[:500])))
                raise
            timing = timed = None
            t_timing = time.perf_counter()
            if verdict.passed:
                try:
                    timed = timed_fn(definition, name, fn)
                    graph = d.spec.reference_graph_safe or name != registry.REFERENCE
                    timing = measure(definition, timed, trials[0][0], probe, l2, graph=graph)
                    if timed is not fn:
                        extra["timed"] = "the engine's own call, without the index guard"
                        extra["guarded"] = guarded_times(measure(definition, fn, trials[0][0], probe, l2, graph=graph))
                except gate.ContextLost as exc:
                    _emit_timed(emit, w, timed_rows)
                    emit("result", _row(name, w, Verdict(RUNTIME_ERROR, f"timing: {exc} (CUDA context lost)"[:500])))
                    raise
                except Exception as exc:
                    verdict = Verdict(RUNTIME_ERROR, f"timing failed: {type(exc).__name__}: {exc}"[:500],
                                           verdict.max_abs_err, verdict.max_rel_err, verdict.metrics)
            verdict.metrics.update(extra, **costs.get(name, {}), inputs_s=round(inputs_s, 3), screen_s=screen_s,
                                   gate_s=round(t_timing - t_gate, 3), timing_s=round(time.perf_counter() - t_timing, 3))
            if timing is not None and in_turns:
                timed_rows.append((name, verdict, timing, timed, fn if timed is not fn else None))
            else:
                emit("result", _row(name, w, verdict, timing))
        if timed_rows:
            emit("start", EAGER_TURNS, w["uuid"])  # a crash now blames none of the variants (tuner/pool.py)
            t_turns = time.perf_counter()
            try:
                base = job.extra.get("baseline")
                took = _eager_in_turns(definition, timed_rows, trials[0][0], budget, l2, base,
                                       _companion(definition, base, w, trials[0][0], timed_rows))
                outcome = {"eager_turns_s": round(time.perf_counter() - t_turns, 3)}
            except gate.ContextLost:
                _emit_timed(emit, w, timed_rows)
                raise
            except Exception as exc:  # keep the probes' eager times, and say so
                took, outcome = {r[0] for r in timed_rows}, {"eager_turns": f"failed: {type(exc).__name__}: {exc}"[:300]}
            for name, verdict, *_ in timed_rows:
                if name in took:
                    verdict.metrics.update(outcome)
            _emit_timed(emit, w, timed_rows)
        del trials
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _emit_timed(emit: Callable, w: dict, timed_rows: list) -> None:
    for name, verdict, timing, *_ in timed_rows:
        emit("result", _row(name, w, verdict, timing))
    timed_rows.clear()


def _companion(definition: str, baseline: str | None, w: dict, args, timed_rows: list) -> Callable | None:
    """The baseline's call (as its rows time it) where the workload's timed rows lack the baseline
    (a tune of some variants only): it takes the turns too, so that their rows are paired with it,
    its own row untouched. None where it is among them, or cannot be loaded or run on these inputs
    (the rows then go unpaired, compared by their spreads: tuner/fit.py)."""
    if baseline is None or not timed_rows or any(r[0] == baseline for r in timed_rows):
        return None
    try:
        timed = timed_fn(definition, baseline, resolve_fn(definition, baseline, w))
        with torch.no_grad():
            timed(*gate.private_copy(definition, args))
    except gate.ContextLost:
        raise
    except Exception:  # noqa: BLE001 - an unpaired row is what a tune without the companion stores
        return None
    return timed


def _eager_in_turns(definition: str, timed_rows: list, args, budget: Budget, l2: int, baseline: str | None,
                    companion: Callable | None = None) -> set:
    """Replaces the eager times of the timed rows (and of a guarded baseline's guarded call) with
    ones taken in turns (`timing.eager_in_turns`) and returns their names; rows at or over SLOW_US
    keep their probe's. Where
    the `baseline` took its turns too, each other row also gets its calls' ratios to the baseline's
    of the same round (metrics "eager_paired": median and 90th percentile): both met the same spell
    of the host, so the ratio's spread is the comparison's own, not two calls' spreads added
    (tuner/fit.py). `companion`: the baseline's call where it has no row here (`_companion`), in the
    turns for the pairing alone."""
    fns, first = {}, {}
    for name, verdict, timing, timed, guarded in timed_rows:
        if timing.eager_us is not None and timing.eager_us < SLOW_US:
            fns[name], first[name] = timed, timing.eager_us
            g = verdict.metrics.get("guarded")
            if guarded is not None and g and g.get("eager_us") is not None:
                fns[(name, "guarded")], first[(name, "guarded")] = guarded, g["eager_us"]
    if not fns:
        return set()
    if companion is not None:  # as many rounds as without it: its first estimate the others' median
        fns[baseline], first[baseline] = companion, statistics.median(first.values())
    samples = eager_in_turns(definition, fns, args, budget, l2, first)
    times = {n: (statistics.median(x), percentile(x, 0.1), percentile(x, 0.9)) for n, x in samples.items()}
    base = samples.get(baseline)
    for name, verdict, timing, *_ in timed_rows:
        cpu = timing.method == "cpu"  # there the eager time is the time
        if name in times:
            timing.eager_us, timing.eager_p10_us, timing.eager_p90_us = times[name]
            if base is not None and name != baseline:  # round by round against the baseline's call
                ratios = [v / b for v, b in zip(samples[name], base)]
                verdict.metrics["eager_paired"] = {"baseline": baseline, "median": round(statistics.median(ratios), 4),
                                                   "p90": round(percentile(ratios, 0.9), 4)}
            if cpu:
                timing.median_us, timing.p10_us, timing.p90_us = times[name]
        if (name, "guarded") in times:
            g = verdict.metrics["guarded"]
            g["eager_us"], g["eager_p10_us"], g["eager_p90_us"] = times[(name, "guarded")]
            if cpu:
                g["median_us"], g["p10_us"], g["p90_us"] = times[(name, "guarded")]
    return {n for n in fns if isinstance(n, str) and not (companion is not None and n == baseline)}


def retake_eager_job(job: Job, emit: Callable) -> None:
    """`tune --eager-turns-only`: per workload, the eager times of the variants in `job.pending` taken
    again in turns (`_eager_in_turns`), with no gate and no graph timing: the rows passed with this
    code (tuner/plan.py `retake_plan`), and only their eager times change. `job.extra["rows"]`: uuid ->
    variant -> (method, eager us, the guarded call's eager us or None), the store's first estimates.
    Emits a partial row per variant (status, eager times, the turns' metrics; the times of a row
    timed on the CPU, where the eager time is the time); a workload whose turns fail emits none, and
    its rows keep their times."""
    from kdispatch.workloads import materialize

    budget = Budget.quick() if job.quick else Budget()
    device = torch.device(job.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0
    definition = defs.get(job.definition).name
    registry.discover()
    for w in job.workloads:
        names = job.pending.get(w["uuid"], [])
        if not names:
            continue
        emit("start", EAGER_TURNS, w["uuid"])
        t0 = time.perf_counter()
        try:
            args = list(materialize(definition, gate.trial_workload(w, 0), device=device, seed=0,
                                    trace_root=w.get("root")))
            timed_rows = []
            for name in names:
                method, eager_us, guarded_us = job.extra["rows"][w["uuid"]][name]
                fn = resolve_fn(definition, name, w)
                timed = timed_fn(definition, name, fn)
                verdict = Verdict(PASSED, metrics={} if guarded_us is None else {"guarded": {"eager_us": guarded_us}})
                timing = Timing(method, 0.0, 0.0, 0.0, eager_us, 0, 0)
                timed_rows.append((name, verdict, timing, timed, fn if timed is not fn else None))
            base = job.extra.get("baseline")
            took = _eager_in_turns(definition, timed_rows, args, budget, l2, base,
                                   _companion(definition, base, w, args, timed_rows))
        except gate.ContextLost:
            raise
        except Exception as exc:  # noqa: BLE001 - the rows keep their times (tuner/flows.py stores none of these)
            reason = f"eager turns failed: {type(exc).__name__}: {exc}"[:500]
            for name in names:
                emit("result", {"variant": name, "uuid": w["uuid"], "axes": w["axes"], "status": RUNTIME_ERROR,
                                "reason": reason, "measured_at": now()})
            continue
        seconds = round(time.perf_counter() - t0, 3)
        for name, verdict, timing, *_ in timed_rows:
            if name not in took:
                continue
            row = {"variant": name, "uuid": w["uuid"], "axes": w["axes"], "status": PASSED, "measured_at": now(),
                   "eager_us": timing.eager_us, "eager_p10_us": timing.eager_p10_us,
                   "eager_p90_us": timing.eager_p90_us, "metrics": {**verdict.metrics, "eager_turns_s": seconds}}
            if timing.method == "cpu":
                row.update(median_us=timing.median_us, p10_us=timing.p10_us, p90_us=timing.p90_us)
            emit("result", row)
        del args
        if device.type == "cuda":
            torch.cuda.empty_cache()


def warm_job(job: Job, emit: Callable) -> None:
    """The warm-up before the measuring (`kdispatch tune --warm N`): calls each pending variant once on
    its workload's inputs (the guarded call and the engine's, where they differ), checking, timing and
    storing nothing. Several such workers share a GPU, so the first calls' compiles (Triton, NVRTC and
    the libraries' JITs, each cached on disk) run on several CPU cores at once, ahead of the one
    worker per GPU that measures and then finds them compiled. Emits a row per pair for the progress
    line only (PASSED: it ran; RUNTIME_ERROR: it raised, which its gate will record)."""
    from kdispatch.workloads import materialize

    device = torch.device(job.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    definition = defs.get(job.definition).name
    registry.discover()
    for w in job.workloads:
        names = [n for n in job.pending.get(w["uuid"], []) if n not in WARM_SKIPS]
        if not names:
            continue
        emit("start", None, w["uuid"])
        try:
            args = list(materialize(definition, w, device=device, seed=0, trace_root=w.get("root")))
        except Exception as exc:
            for name in names:
                emit("result", _row(name, w, Verdict(RUNTIME_ERROR, f"warm-up inputs: {type(exc).__name__}: {exc}"[:500])))
            if not gate.healthy(device):
                raise gate.ContextLost(f"warm-up inputs: {exc}"[:500]) from exc
            continue
        for name in names:
            emit("start", name, w["uuid"])
            verdict = Verdict(PASSED, "", 0.0, 0.0, {})
            try:
                fn = resolve_fn(definition, name, w)
                for call in dict.fromkeys((fn, timed_fn(definition, name, fn))):
                    call(*gate.private_copy(definition, args))
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            except Exception as exc:
                verdict = Verdict(RUNTIME_ERROR, f"warm-up: {type(exc).__name__}: {exc}"[:500])
                if not gate.healthy(device):
                    emit("result", _row(name, w, verdict))
                    raise gate.ContextLost(verdict.reason) from exc
            emit("result", _row(name, w, verdict))
        del args
        if device.type == "cuda":
            torch.cuda.empty_cache()


WARM_SKIPS = ("routed", ROUTED_HINTED, registry.REFERENCE)  # the bench's routed op; the reference runs torch ops


def _us(x: float | None) -> str:
    return "not capturable" if x is None else f"{x:.1f} us"


def screen(definition: str, baseline: str | None, names: list[str], args, factor: float,
           started: Callable[[str], None] = lambda name: None, costs: dict | None = None) -> dict[str, dict]:
    """The variants among `names` to leave ungated and untimed on this workload, with their rough
    times: over `factor` times the fastest screened one's graph time (or not capturable) and eager
    time (`timing.screen_us`, on one private copy of the inputs that every screened call may
    overwrite). The baseline is the yardstick, screened always and never left out; a variant that
    raises here is not left out (its gate records why); nothing is left out where the baseline raises.
    `started(name)` before each (the worker's "start": a crash is blamed on that variant). The
    fastest may still fail its gate: what it left out is then not measured there, the baseline is.
    `costs`, if given, receives per screened variant the seconds of its first call (compiles) and of its
    rough times: {"screen_first_s", "screen_rough_s"} (what the screen costs, `benchmarks/tune_time.py`)."""
    candidates = [n for n in names if n not in ("routed", ROUTED_HINTED, baseline)]
    if baseline is None or not candidates:
        return {}
    args = gate.private_copy(definition, args)
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    times = {}
    for name in [baseline, *candidates]:
        started(name)
        t0 = time.perf_counter()
        try:
            fn = timed_fn(definition, name, resolve_fn(definition, name))
            fn(*args)  # compiles outside the timers (the gate would have)
            t1 = time.perf_counter()
            times[name] = screen_us(fn, args, graph=defs.get(definition).spec.reference_graph_safe
                                    or name != registry.REFERENCE)
            if costs is not None:
                costs[name] = {"screen_first_s": round(t1 - t0, 3), "screen_rough_s": round(time.perf_counter() - t1, 3)}
        except Exception as exc:
            if not gate.healthy(device):
                raise gate.ContextLost(f"screening {name}: {type(exc).__name__}: {exc}"[:500]) from exc
            if name == baseline:
                return {}
    graphs = [g for g, _ in times.values() if g is not None]
    best_g, best_e = min(graphs, default=None), min(e for _, e in times.values())
    out = {}
    for name in candidates:
        if name not in times:
            continue
        g, e = times[name]
        if e > factor * best_e and (g is None or (best_g is not None and g > factor * best_g)):
            out[name] = {"graph_us": None if g is None else round(g, 2), "eager_us": round(e, 2),
                         "best_graph_us": None if best_g is None else round(best_g, 2),
                         "best_eager_us": round(best_e, 2), "factor": factor}
    return out


def _row(name: str, w: dict, v: Verdict, t: Timing | None = None) -> dict:
    row = {"variant": name, "uuid": w["uuid"], "axes": dict(w["axes"]), "status": v.status, "reason": v.reason,
           "max_abs_err": v.max_abs_err, "max_rel_err": v.max_rel_err, "metrics": dict(v.metrics),
           "measured_at": now()}
    if t is not None:
        row.update(method=t.method, median_us=t.median_us, p10_us=t.p10_us, p90_us=t.p90_us, eager_us=t.eager_us,
                   eager_p10_us=t.eager_p10_us, eager_p90_us=t.eager_p90_us, sets=t.sets, reps=t.reps)
        if t.note:
            row["reason"] = (row["reason"] + "; " if row["reason"] else "") + t.note
    return row
