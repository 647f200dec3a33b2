"""The `tune`, `route` and `bench` flows.

`tune`:
  1. the environment (device name, SM, driver; torch, triton, CUDA, flashinfer versions);
  2. per definition, the plan (tuner/plan.py): variants that run here, the trace set's workloads,
     and the (variant, workload) pairs the store lacks for this environment and these source hashes;
  3. the jobs run on the worker pool (tuner/pool.py); every result row is stored as it arrives, so
     an interrupted tune resumes where it stopped;
  4. the store's text twin is rewritten and the routers are compiled (tuner/fit.py, codegen.py).
`bench` measures the baseline, the variants and the routed op on any workload set, in memory, and
`bench_table` prints them side by side.
"""
from __future__ import annotations

import dataclasses
import io
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kdispatch import definitions as defs
from kdispatch import provenance, registry
from kdispatch.checks import PASSED

from . import codegen, features
from . import fit as fitting
from .job import ROUTED_HINTED, WARM_SKIPS, now
from .plan import (QUICK_DIR, ROUTERS_DIR, Plan, detect_environment, make_jobs, parse_devices, plan, retake_plan,
                   taken_in_turns, unpaired_in_turns, workload_dicts)
from .pool import Progress, clock, execute
from .stats import MODES, beats, geomean, slower, timed
from .store import RESULTS_DIR, Result, Store, default_path, slug, stores_in
from .timing import SLOW_US


# ----------------------------------------------------------------------------------------------
# tune / route / bench
# ----------------------------------------------------------------------------------------------

@dataclass
class TuneResult:
    env: dict
    plans: list[Plan]
    measured: list[tuple[str, str, str]] = field(default_factory=list)  # (definition, variant, uuid)
    routers: list = field(default_factory=list)  # (definition, path, policy)
    seconds: float = 0.0
    complete: bool = True


def tune(roots, *, definitions=None, variants=None, skip_variants=None, device: str = "cuda",
         store: Store | str | None = None, out=None, quick: bool = False, force: bool = False,
         trials: int | None = None, env: dict | None = None,
         executor: str | None = None, in_process: bool | None = None, timeout: float = 300.0, stream=None,
         compile_routers: bool = True, max_minutes: float | None = None, screen: float | None = None,
         warm: int = 0, eager_turns: bool = False, eager_only: bool = False,
         retake_before: str | None = None, stand_in: bool = False) -> TuneResult:
    """Measures what the store lacks, then compiles the routers. Returns what it did.

    `warm`: worker processes per GPU that first call every pending variant once on its workload
    (tuner/job.py `warm_job`), so that the compiles run in parallel ahead of the measuring worker;
    0 (and on the CPU, or with another executor): none. Measured on an H200 host (2026-11-28,
    benchmarks/results/warm-ab-H200.txt): the measuring of the pool prefill ran 31% faster after
    a 41-52 s warm-up (about 11% off that definition's tune), the decode family's not enough to pay
    for its 36 s; a warm-up also repeats with every resumed run, so it is off unless asked for.

    `screen`: a factor; a variant whose rough time on a workload is over it times the fastest's, in
    both call modes, is neither gated nor timed there (tuner/job.py; `kdispatch tune` screens at
    `cli.SCREEN_FACTOR` unless told otherwise).

    `eager_turns`: each workload's variants take their eager times together, in turns (tuner/job.py),
    as `bench` does; rows of each variant's own eager loop are not comparable with them (`route`
    warns of a definition that mixes the two). Without it a definition's new rows take their eager
    times as most of its stored rows on this GPU did (`stored_in_turns`), in each variant's own loop
    where it has none.

    `eager_only`: measure nothing new; take the eager times of the store's rows again, in turns, each
    workload's passing rows of this environment and code together (tuner/plan.py `retake_plan`,
    tuner/job.py `retake_eager_job`): no gate, no graph timing, so a definition measured in each
    variant's own loop becomes one of turns in a fraction of a tune (`force`: workloads already
    in turns too; `retake_before`, a UTC time: those with a row measured before it too, which is how
    a forced retake cut short resumes, given its start). Resumable like a tune.

    `max_minutes`: stop measuring after this long (then the store's twin is written and the routers
    compiled from what was measured; re-running resumes). SIGTERM is handled the same way.

    `stand_in`: measure a definition whose store rows on this GPU were taken against a library baseline that
    does not run here, with the next one that does (the reference at worst) as its baseline; without it
    such a tune raises `StandInBaseline` before measuring anything (`stand_in_baselines`)."""
    t0, started = time.monotonic(), now()
    stream = stream or sys.stderr
    devices = parse_devices(device)
    env = env or detect_environment(devices)
    if store is None or isinstance(store, (str, Path)):
        path = Path(store) if store is not None else (QUICK_DIR / f"{slug(env['device'])}.sqlite" if quick
                                                      else default_path(env["device"]))
        store = Store.open(path)
    eid = store.add_env(env)
    names = [defs.resolve_name(d) for d in (definitions or defs.names())]
    if eager_only:
        retakes = [retake_plan(store, eid, env["arch"], roots, d, quick, force, SLOW_US, taken_before=retake_before,
                               variant_names=set(variants) if variants else None, skip=set(skip_variants or ()))
                   for d in names]
        plans, retaken = [p for p, _ in retakes], {p.definition: rows for p, rows in retakes}
    else:
        plans = [plan(store, eid, env["arch"], roots, d, set(variants) if variants else None, quick, force,
                      skip=set(skip_variants or ()))
                 for d in names]
        for p in plans:  # new rows take their eager times as the stored ones did, so the eager fit compares like
            p.eager_turns = bool(p.pending) and stored_in_turns(store, env["device"], p.definition)
    stand_ins = [] if stand_in else stand_in_baselines(store, env["device"], env["arch"], plans)
    if stand_ins:
        raise StandInBaseline("\n".join(stand_ins))
    total = sum(len(p.pending) for p in plans)
    progress = Progress(total, stream)
    stream.write(f"[tune] {env['device']} ({env['arch']}), torch {env['torch']}, triton {env['triton']}, "
                 f"CUDA {env['cuda']}, flashinfer {env['flashinfer']}; store {store.path or ':memory:'}\n")
    for p in plans:
        stream.write(f"[tune] {defs.get(p.definition).short}: {len(p.workloads)} workloads, baseline "
                     f"{p.baseline}, variants {', '.join(sorted(p.variants))}; {len(p.pending)} to measure"
                     + (f" ({p.skipped_unsupported} shapes declined by their `supports`)" if p.skipped_unsupported else "")
                     + "\n")
    result = TuneResult(env, plans)
    info = {p.definition: p for p in plans}

    def on_row(definition: str, row: dict) -> None:
        if eager_only:
            if _merge_eager(store, retaken[definition], definition, row, stream):
                result.measured.append((definition, row["variant"], row["uuid"]))
            return
        p = info[definition]
        v = p.variants[row["variant"]]
        store.put(_result(eid, definition, v, row))
        result.measured.append((definition, row["variant"], row["uuid"]))

    result.complete = True
    if total:
        # Each GPU worker sees exactly its GPU (CUDA_VISIBLE_DEVICES), as cuda:0.
        jobs = make_jobs(plans, len(devices), "cpu" if devices == ["cpu"] else "cuda:0", quick, trials,
                         "kdispatch.tuner.job:retake_eager_job" if eager_only else executor,
                         None if eager_only else screen, eager_turns or eager_only)
        for job in jobs if eager_only else ():  # the rows' first estimates, for the turns' round count
            rows = retaken[job.definition]
            job.extra["rows"] = {u: {n: (rows[u][n].method, rows[u][n].eager_us,
                                         ((rows[u][n].metrics or {}).get("guarded") or {}).get("eager_us"))
                                     for n in names} for u, names in job.pending.items()}
        deadline = t0 + 60 * max_minutes if max_minutes else None
        previous = signal.signal(signal.SIGTERM, _sigterm) if _main_thread() else None
        try:
            if warm > 0 and devices != ["cpu"] and not in_process and executor is None and not eager_only:
                result.complete = _warm_up(plans, devices, warm, quick, trials, timeout, deadline, stream)
                progress.t0 = time.monotonic()  # the measuring's rate, for its ETA
            if result.complete:
                result.complete = execute(jobs, devices, on_row, progress, in_process=in_process, timeout=timeout,
                                          deadline=deadline)
        except KeyboardInterrupt:
            result.complete = False
            stream.write("\n[tune] interrupted: what was measured is stored; re-run to continue\n")
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if store.path is not None:
                store.drop_superseded()
                store.dump_jsonl()
    elif store.path is not None:
        store.drop_superseded()
        store.dump_jsonl()
    if not compile_routers and not eager_only:
        # no route to warn of a mix this tune made (new variants' own-loop rows among turns rows):
        # say so here, where a held-out store's check would otherwise score unlike eager times; on
        # the workloads of this tune's sets, as `route` fits and `--eager-turns-only` retakes (rows of
        # workloads since dropped from the sets are neither)
        in_sets = {p.definition: [w["uuid"] for w in p.workloads] for p in plans}
        for d in sorted({d for d, _, _ in result.measured}):
            table = fitting.load_table(store, d, env["arch"], in_sets[d])
            if table is not None:
                _warn_mixed_eager(table, stream, "tune")
                _warn_unpaired_eager(table, stream, "tune")
    if compile_routers:
        uuids = {p.definition: [w["uuid"] for w in p.workloads] for p in plans}
        out = out if out is not None else (QUICK_DIR / "routers" if quick else ROUTERS_DIR)
        hints = {d: hint_values(d, roots) for d in defs_with_hints(names)}  # for the routers' hinted fits
        result.routers = compile_all(store, out, env["arch"], names, uuids, stream=stream, hints=hints)
    result.seconds = time.monotonic() - t0
    left = total - len(result.measured)
    stream.write(f"[tune] measured {len(result.measured)} (variant, workload) pairs in {clock(result.seconds)}"
                 + resume_advice(left, force=force and eager_only, retake_before=retake_before, started=started)
                 + "\n")
    return result


def resume_advice(left: int, *, force: bool, retake_before: str | None, started: str) -> str:
    """What the tune's last line says of the pairs it left: re-run the command, except after a forced
    eager retake, which would begin again: the workloads it has not reached are those with a row
    measured before it started."""
    if left <= 0:
        return ""
    if force:
        return (f"; {left} left: re-run without --force, with --retake-before {retake_before or started}, to take "
                "them (--force would begin again)")
    return f"; {left} left: re-run the same command to measure them"


def _merge_eager(store: Store, rows: dict, definition: str, row: dict, stream) -> bool:
    """`tune(eager_only=True)`: a retaken row's eager times (and its turns' metrics) into its stored
    row, whose pairing with the baseline (`eager_paired`) is replaced or dropped with them; the row
    says when (`measured_at`). A failed workload's rows are reported once and left as they were."""
    r = rows.get(row["uuid"], {}).get(row["variant"])
    if r is None:
        return False
    if row.get("status") != PASSED:
        if row["variant"] == min(rows[row["uuid"]]):  # one line a workload
            stream.write(f"[tune] {defs.get(definition).short} {row['uuid']}: {row.get('reason', '')}; its rows keep "
                         "their eager times\n")
        return False
    metrics = {k: v for k, v in (r.metrics or {}).items() if k != "eager_paired"}
    for k, v in row.get("metrics", {}).items():
        metrics[k] = {**metrics.get("guarded", {}), **v} if k == "guarded" else v
    times = {k: row[k] for k in ("eager_us", "eager_p10_us", "eager_p90_us", "median_us", "p10_us", "p90_us") if k in row}
    store.put(dataclasses.replace(r, metrics=metrics, measured_at=row["measured_at"], **times))
    return True


def _warm_up(plans, devices: list[str], per_device: int, quick: bool, trials, timeout: float,
             deadline: float | None, stream) -> bool:
    """`tune(warm=N)`'s first step: N warm-up workers on each GPU (tuner/job.py `warm_job`) call the
    pending variants once; nothing is stored. False when the deadline stopped it."""
    plans = [dataclasses.replace(p, pending=[(n, u) for n, u in p.pending if n not in WARM_SKIPS]) for p in plans]
    total = sum(len(p.pending) for p in plans)
    if not total:
        return True
    t0 = time.monotonic()
    workers = [d for d in devices for _ in range(per_device)]
    stream.write(f"[warm] {total} first calls on {len(workers)} workers ({per_device} a GPU), compiles to the "
                 f"disk caches before the measuring\n")
    jobs = make_jobs(plans, len(workers), "cuda:0", quick, trials, "kdispatch.tuner.job:warm_job")
    done = execute(jobs, workers, lambda definition, row: None, Progress(total, stream, "warm"), timeout=timeout,
                   deadline=deadline)
    stream.write(f"[warm] {clock(time.monotonic() - t0)}\n")
    return done


def _sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def compile_all(store: Store, out, arch: str | None = None, definitions=None, uuids: dict | None = None,
                stream=None, params: fitting.FitParams | None = None, hints: dict | None = None) -> list:
    """Fits and writes a router for every (definition, arch) the store has data for; where the
    definition has call-time hints and `hints` gives their values ({definition: {uuid: {hint:
    value}}}, `hint_values`), also the policy for calls that pass them (`Policy.hinted`). Where
    several GPU models of the architecture measured the definition, the architecture's router is
    fitted on all their rows (a region wins on each: it serves models nobody measured) and each
    model whose workloads span the joint fit's measured range gets one fitted on its own rows
    (`Policy.devices`, routers/<arch>/<model>/; a model measured over part of it would extrapolate
    where the joint fit has rows, so the joint router serves it until its tune completes): the joint
    fit's compromises cost a measured model regret (H100 held-out, 2026-11-28: pool prefill qk8
    28.9% -> 1.8% mean, verify_steps qk2 5.4% -> 1.8%, decode 1.4% -> 0.4%, graph calls). Where the
    joint fit keeps one model's rows alone (the others lack a variant's rows, `_without_unmeasured`:
    the H100's prefills without `flashinfer_direct`), that model's router is the architecture's,
    whose header names it alone: a file of its own would repeat it."""
    stream = stream or sys.stderr
    done = []
    for a, d, policy in fit_policies(store, arch, definitions, uuids, stream, params, hints):
        path = codegen.write(policy, out)
        stream.write(summarize(policy, path) + "\n")
        for name, own in policy.devices.items():
            stream.write(summarize(own, codegen.write(own, out, name)) + "\n")
        codegen.remove_model_routers(out, a, d, keep=policy.devices)
        done.append((d, path, policy))
    return done


def fit_policies(store: Store, arch: str | None = None, definitions=None, uuids: dict | None = None, stream=None,
                 params: fitting.FitParams | None = None, hints: dict | None = None, jobs: int | None = None):
    """Yields (arch, definition, policy) for every (definition, arch) the store has data for, fitted as
    `compile_all` writes them (the architecture's policy, each measured model's own in `devices`).
    The fits run on `jobs` processes (default: this machine's cores) where there is enough to fit
    (`POOL_MIN_ROWS`); each definition's messages still come out just before it is yielded."""
    stream = stream or sys.stderr
    archs = sorted({e["arch"] for e in store.envs()}) if arch is None else [arch]
    entries = []  # (arch, definition, its messages, [(device name or None for the joint fit, table)])
    for a in archs:
        for d in [defs.resolve_name(x) for x in (definitions or defs.names())]:
            table = fitting.load_table(store, d, a, (uuids or {}).get(d))
            if table is None:
                continue
            said = io.StringIO()
            table = _without_retired(table, said)
            _warn_stale(table, said)
            _warn_mixed_eager(table, said)
            _warn_unpaired_eager(table, said)
            joint = _without_unmeasured(table, said, params=params)
            tables = [(None, joint)]
            if len(table.devices) > 1:  # each device measured also gets a policy fitted on its rows alone
                for name in (e["device"] for e in table.devices):
                    if [e["device"] for e in joint.devices] == [name]:
                        continue  # the joint fit kept this device's rows alone: it is that fit already
                    own = _without_unmeasured(table.on_device(name), said, f"route {name}", params)
                    short = _short_of(own, joint.measured_range())
                    if short:  # its own fit would extrapolate where the joint one has measurements
                        said.write(f"[route] {defs.get(d).short} on {name}: measured {short} only; the "
                                   f"architecture's router serves it until its tune covers the range\n")
                        continue
                    tables.append((name, own))
            entries.append((a, d, said.getvalue(), tables))
    tasks = [(t, params, hints) for *_, tables in entries for _name, t in tables]
    jobs = min(jobs or _cores(), len(tasks))
    forks = "fork" in multiprocessing.get_all_start_methods()
    if jobs > 1 and forks and sum(len(t.rows) for t, _p, _h in tasks) >= POOL_MIN_ROWS:
        # fork: the workers need nothing but their task (no CUDA, no store); results come back in order
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            yield from _assemble(entries, pool.map(_fit_task, tasks), stream)
    else:
        yield from _assemble(entries, map(_fit_task, tasks), stream)


# Rows below which `fit_policies` fits in this process: a pool's start and the policies' way back
# (~3 MB pickled for a prefill definition) outweigh fits this small (a pool prefill's ~3,300 rows of
# two devices take ~55 s on one core, the contest prefill's ~8,500 over two minutes).
POOL_MIN_ROWS = 2000


def _cores() -> int:
    """The cores this process may run on (all of them where the OS cannot say)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _fit_task(task):
    table, params, hints = task
    return _fit(table, params, hints)


def _assemble(entries, policies, stream):
    """(arch, definition, policy) per entry, from the policies of its tables in `entries`' order."""
    policies = iter(policies)
    for a, d, said, tables in entries:
        stream.write(said)
        policy = next(policies)
        for name, _t in tables[1:]:
            policy.devices[name] = next(policies)
        yield a, d, policy


def _short_of(table, measured: dict) -> str:
    """Where `table`'s workloads span less than `measured` ({feature: (min, max)}): "" where they
    span it all."""
    gaps = []
    for f, (lo, hi) in measured.items():
        values = [table.features[u][f] for u in table.uuids]
        if not values or (min(values), max(values)) != (lo, hi):
            gaps.append(f"{min(values)} <= {f} <= {max(values)} of {lo} .. {hi}" if values else f"no {f}")
    return ", ".join(gaps)


def _fit(table, params, hints: dict | None):
    """The graph policy (with .eager, and .hinted where the definition has call-time hints and
    `hints` their values) of one table."""
    policy = fitting.fit(table, params)
    d = table.definition
    if defs.get(d).spec.hints and (hints or {}).get(d):
        policy.hinted = fitting.fit(table.with_hints(hints[d]), params)
    return policy


def defs_with_hints(definitions=None) -> list[str]:
    """The definitions (all, or these) that declare call-time hints."""
    return [d for d in (defs.resolve_name(x) for x in (definitions or defs.names())) if defs.get(d).spec.hints]


def pending(roots, *, definitions=None, variants=None, skip_variants=None, device: str = "cuda",
            store: str | Path | None = None, stream=None, eager_only: bool = False, force: bool = False,
            retake_before: str | None = None) -> dict[str, dict[str, int]]:
    """What `tune` would measure, without measuring (`eager_only`: what `tune --eager-turns-only`
    would take again; `force`, `retake_before` as for `tune`): {definition: {variant: pairs}}, printed. On a
    machine without the store's GPU (a development one) the store's newest environment stands in,
    and a library-backed variant's hash is taken under the library versions its rows there recorded
    (its hash holds the versions installed where it runs): planning the GPU machine's time from here."""
    import torch

    stream = stream or sys.stdout
    here = device != "cpu" and torch.cuda.is_available()
    if here:
        env = detect_environment(parse_devices(device))
        path = Path(store) if store is not None else default_path(env["device"])
    else:
        if store is None:
            found = stores_in(RESULTS_DIR)
            if len(found) != 1:
                raise SystemExit(f"--pending without the GPU: name the store (--store), one of {[str(f) for f in found]}")
            store = found[0]
        path = Path(store)
    st = Store.open(path)
    if here:
        eid, hash_of, runs = st.add_env(env), None, None
    else:
        rows = st.results()
        if not rows:
            raise SystemExit(f"{path}: no measurements: nothing tells which machine it is for")
        eid = max(rows, key=lambda r: r.measured_at).env
        env = st.env(eid)
        recorded, newest = {}, {}  # (definition, variant) -> library versions / hash of its newest row there
        for r in sorted(rows, key=lambda r: r.measured_at):
            if r.env == eid:
                newest[(r.definition, r.variant)] = r.variant_hash
                if "library_versions" in (r.metrics or {}):
                    recorded[(r.definition, r.variant)] = r.metrics["library_versions"]

        def hash_of(v):
            if v.backend != "library":
                return v.provenance
            versions = recorded.get((v.definition, v.name))
            if versions is not None:
                return provenance.digest(v.name, v.files, versions)
            # rows from before they recorded versions: whether its code changed cannot be told here
            return newest.get((v.definition, v.name), v.provenance)

        def runs(v):  # here, or measured there (a library this machine lacks)
            return v.why_not(env["arch"]) is None or (v.definition, v.name) in newest
    stream.write(f"[pending] {env['device']} ({env['arch']}), torch {env['torch']}, flashinfer {env['flashinfer']}; "
                 f"store {path}" + ("" if here else " (its newest environment: this machine has not that GPU)") + "\n")
    out, total = {}, 0
    for d in [defs.resolve_name(x) for x in (definitions or defs.names())]:
        p = (retake_plan(st, eid, env["arch"], roots, d, force=force, slow_us=SLOW_US, hash_of=hash_of, runs=runs,
                         taken_before=retake_before, variant_names=set(variants) if variants else None,
                         skip=set(skip_variants or ()))[0]
             if eager_only else plan(st, eid, env["arch"], roots, d, set(variants) if variants else None,
                                     force=force, skip=set(skip_variants or ()), hash_of=hash_of, runs=runs))
        counts: dict[str, int] = {}
        for name, _u in p.pending:
            counts[name] = counts.get(name, 0) + 1
        out[d] = counts
        total += len(p.pending)
        if counts:  # with the baseline they pair with, and the packages it needs there (`stand_in_baselines`)
            needs = registry.get(d, p.baseline).requires
            stream.write(f"[pending] {defs.get(d).short}: {len(p.pending)} ("
                         + ", ".join(f"{n} {c}" for n, c in sorted(counts.items())) + f"); baseline {p.baseline}"
                         + (f" (needs {', '.join(needs)})" if needs else "") + "\n")
    stream.write(f"[pending] {total} (variant, workload) pairs to measure\n")
    return out


def hint_values(definition: str, roots) -> dict[str, dict[str, int]]:
    """uuid -> the definition's call-time hint values, for its workloads in the trace sets `roots`."""
    from kdispatch.workloads import hint_values as values

    if not defs.get(definition).spec.hints:
        return {}
    return {w["uuid"]: values(definition, w, trace_root=w["root"]) for w in workload_dicts(roots, definition)}


def check_routers(done, check: Store, stream, hints: dict | None = None) -> dict:
    """Each fitted router's regret per call mode on a store of workloads it was not fitted on
    (`fit.measured_regret`; a GPU model's rows scored with its own router where it has one): printed, and returned as {definition: {mode: summary}}; for a router
    with a hinted policy also {"hinted": {mode: summary}}, with `hints` giving the workloads' values
    (as `compile_all`)."""
    out = {}
    for d, _path, policy in done:
        t = fitting.load_table(check, d, policy.arch)
        if t is None:
            continue
        t = _without_unmeasured(_without_retired(t, stream, "check"), stream, "check")
        # each device's rows scored with the router that serves it (its own where it has one)
        parts = [(policy.for_device(e["device"]), t.on_device(e["device"])) for e in t.devices]
        out[d] = _check_scores(parts)
        if policy.hinted is not None and (hints or {}).get(d):
            out[d]["hinted"] = _check_scores([(p.hinted or policy.hinted, pt.with_hints(hints[d])) for p, pt in parts])
        stale = _warn_stale(t, stream, "check")
        if stale:  # the check scores these variants' old code: the JSON says so
            out[d]["stale_variants"] = stale
        # how the scored eager times were taken ("turns", "own loop" or "mixed"): regrets of the two differ
        counts = _eager_protocols(t).values()
        turns, own = sum(c[0] for c in counts), sum(c[1] for c in counts)
        out[d]["eager_protocol"] = "mixed" if turns and own else "turns" if turns else "own loop"
        rows = [(CHECK_LABELS[k], out[d][k]) for k in CHECK_LABELS] + [
            (f"{CHECK_LABELS[k]} hinted", out[d]["hinted"][k]) for k in CHECK_LABELS if "hinted" in out[d]]
        for label, h in rows:
            if h.get("workloads"):
                stream.write(f"[check] {defs.get(d).short} {label}: {h['workloads']} workloads, "
                             f"{_regret_text(h, '[check]')}\n")
    return out


# the check's scores of a router: per call mode, and eager again with every row's host part at the fit's
# `fast_host` (`fit.measured_regret_of`): what a faster host than the check store's would see
CHECK_LABELS = {"graph": "graph", "eager": "eager", "eager_fast_host": "eager, faster host"}


def _check_scores(parts) -> dict:
    return {**{m: fitting.measured_regret_of(parts, m) for m in MODES},
            "eager_fast_host": fitting.measured_regret_of(parts, "eager", fast_host=True)}


def _regret_text(h: dict, prefix: str) -> str:
    """A regret summary (`fit.measured_regret`) in words, and on a line of its own (each starting with
    `prefix`) the call of the largest regret where a variant other than the one served was faster:
    its shape, what served it, what was fastest, the baseline's time."""
    text = (f"regret {h['regret_mean_pct']:.2f}% mean / {h['regret_max_pct']:.2f}% max, "
            f"{h['speedup_vs_baseline']:.3f}x over baseline, {h['slower_than_baseline']} slower than baseline, "
            f"{h['unsafe']} unsafe")
    w = h["worst"]
    if w["routed"] == w["best"]:
        return text
    shape = ", ".join(f"{k}={v}" for k, v in w["features"].items())
    return (f"{text}\n{prefix}     worst {shape}: {w['routed']} {w['routed_us']:.1f} us, best {w['best']} "
            f"{w['best_us']:.1f} us (+{w['regret_pct']:.1f}%), baseline {w['baseline_us']:.1f} us")


def _without_retired(table, stream, step: str = "route"):
    """The table without the variants the store measured that are no longer registered (one split
    into launch configurations, say): a router naming one would hand its region to the next in the
    chain, chosen on the retired code's times. Where a kernel module failed to import here, a missing
    name may be a variant that did not load: nothing is left out then."""
    if registry.import_failures():
        return table
    known = {v.name for v in registry.variants(table.definition)}
    retired = sorted(n for n in table.hashes if n not in known and n != table.baseline)
    for name in retired:
        stream.write(f"[{step}] warning: {defs.get(table.definition).short} {name}: no longer registered; "
                     "its measurements are left out\n")
    return table.without(retired) if retired else table


def _without_unmeasured(table, stream, step: str = "route", params=None):
    """The table without the workloads where a variant it measured elsewhere has no row although it
    takes the shape (a tune cut short, a workload added since, one of an earlier coverage set measured
    only by the variants of its day): fitted on, the missing row would keep that variant out of any
    region holding the workload, and a missing baseline row is imputed. The reference counts only
    where it is the baseline (elsewhere the tuner measures it only as the gate's oracle). A variant
    that beats the baseline on none of the workloads it was measured on, in either call mode, cannot
    be chosen anywhere, so its gaps keep their workloads (a slow peer half-measured would otherwise
    take workloads out of the fit until its tune completes)."""
    gone = set()
    for name in table.hashes:
        if name == registry.REFERENCE and name != table.baseline:
            continue
        v = registry.get(table.definition, name)
        missing = {u for u in table.uuids if (name, u) not in table.rows and v.declines(dict(table.axes[u])) is None}
        if missing and name != table.baseline and not _wins_anywhere(table, name, params or fitting.FitParams()):
            stream.write(f"[{step}] {defs.get(table.definition).short} {name}: not measured on {len(missing)} "
                         "workload(s) and faster than the baseline on none it was: they stay in the fit\n")
            continue
        gone |= missing
    if gone:
        stream.write(f"[{step}] warning: {defs.get(table.definition).short}: {len(gone)} workload(s) left out, a "
                     "variant that takes them not measured there (re-run `kdispatch tune` for those in the sets)\n")
    return table.subset([u for u in table.uuids if u not in gone]) if gone else table


def _wins_anywhere(table, name: str, params) -> bool:
    """Does `name` beat the baseline (its engine call or its guarded call) beyond the fit's margin on
    some workload, in some call mode, or pass where the baseline failed?"""
    gain = fitting.required_gain(params, table.definition, name)
    for (v, u), r in table.rows.items():
        if v != name or not r.passed:
            continue
        b = table.rows.get((table.baseline, u))
        if b is None or not b.passed:
            return True
        for mode in MODES:
            x = timed(r, mode) if mode == "eager" or r.routable else None  # as the fit: graphs need a capture
            if x is not None and any(tb is not None and beats(x, tb, gain)
                                     for tb in (timed(b, mode), timed(b, mode, guarded=True))):
                return True
    return False


class StandInBaseline(RuntimeError):
    """A tune would measure against another baseline than the store's rows on this GPU were measured against."""


def stand_in_baselines(store: Store, device: str, arch: str, plans: list[Plan]) -> list[str]:
    """Why each plan with pending pairs would be measured against a stand-in: the device's rows of its
    definition name a library baseline ahead of the plan's in the registry's order that does not run
    here (a package missing). The stand-in would be timed as the baseline and every new row's eager
    turns paired with it, not with the call the fit compares against (an H200 tune without SGLang's
    package, 2026-12-03: the reference stood in for the pool prefills' baseline, 557 rows' turns paired
    with it)."""
    envs = {e["id"] for e in store.envs() if e["device"] == device}
    out = []
    for p in plans:
        if not p.pending:
            continue
        libs = [v for v in registry.variants(p.definition) if v.baseline]
        rank = {v.name: i for i, v in enumerate(libs)}
        measured = {r.variant for r in store.results(p.definition) if r.env in envs and r.baseline}
        ahead = [v for v in libs if v.name in measured and rank[v.name] < rank.get(p.baseline, len(libs))]
        if ahead:
            v = ahead[0]
            out.append(f"{defs.get(p.definition).short}: its rows on {device} were measured against {v.name}, which "
                       f"does not run here ({v.why_not(arch)}); {p.baseline} would stand in as the baseline. Install "
                       f"what it needs (the GPU machine: benchmarks/stage_engines.sh's bundles), leave the definition "
                       f"out, or pass --stand-in-baseline")
    return out


def stored_in_turns(store: Store, device: str, definition: str) -> bool:
    """Did most of the device's timed rows of the definition take their eager times in turns
    (`_eager_protocols`)? A tune then takes its new rows' so too: a variant that lands later, or one
    re-measured after a change, stays comparable with the rest instead of mixing the two protocols."""
    envs = {e["id"] for e in store.envs() if e["device"] == device}
    rows = [r for r in store.results(definition)
            if r.env in envs and r.passed and r.eager_us is not None and r.eager_us < SLOW_US]
    return 2 * sum(map(taken_in_turns, rows)) > len(rows)


def _eager_protocols(table) -> dict[str, tuple[int, int]]:
    """device -> (rows whose eager times were taken in turns with the workload's other variants,
    rows taken in each variant's own loop). Rows at or over SLOW_US keep their own loop's times in a
    turns tune too (the host is noise at that size): they count as neither."""
    out = {}
    for e in table.devices:
        rows = [r for r in table.on_device(e["device"]).rows.values()
                if r.passed and r.eager_us is not None and r.eager_us < SLOW_US]
        turns = sum(map(taken_in_turns, rows))
        out[e["device"]] = (turns, len(rows) - turns)
    return out


def _warn_mixed_eager(table, stream, step: str = "route") -> bool:
    """Warns where one device's rows of the table took their eager times both ways (`_eager_protocols`):
    a variant measured in turns pays more host time per call (benchmarks/results/eager-protocol-H200.txt),
    so the eager fit (or a check's eager regret) would compare unlike times. Returns whether it warned."""
    mixed = False
    short = defs.get(table.definition).short
    for device, (turns, own) in _eager_protocols(table).items():
        if turns and own:
            mixed = True
            stream.write(f"[{step}] warning: {short} on {device}: {turns} rows took their eager times in turns "
                         f"and {own} in each variant's own loop; its eager times compare unlike: take them in "
                         f"turns again (`kdispatch tune --eager-turns-only --definitions {short}`, with the "
                         "same --workloads and --store: no gate, no graph timing), or re-measure it one way "
                         "(`--force`)\n")
    return mixed


def _warn_unpaired_eager(table, stream, step: str = "route") -> int:
    """Warns where rows took their eager times in turns without the baseline's call among them
    (tuner/plan.py `unpaired_in_turns`): a wide baseline spread then hides wins (the contest prefill,
    2026-12-01). Returns how many such rows."""
    short = defs.get(table.definition).short
    total = 0
    for e in table.devices:
        t = table.on_device(e["device"])
        unpaired = [r for (n, u), r in t.rows.items() if unpaired_in_turns(r, t.baseline, t.rows.get((t.baseline, u)))]
        if unpaired:
            total += len(unpaired)
            stream.write(f"[{step}] warning: {short} on {e['device']}: {len(unpaired)} rows took their eager times "
                         f"in turns without the baseline's call, so the eager fit compares them with the baseline "
                         f"by spreads: take them again (`kdispatch tune --eager-turns-only --definitions {short}`, "
                         f"with the same --workloads and --store)\n")
    return total


def _warn_stale(table, stream, step: str = "route") -> list[str]:
    """Warns of each variant whose measurements in `table` predate its current code; returns their
    names. A library-backed variant's hash holds the library versions installed where it ran: on
    another kind of machine (a development one) its code is compared under the versions its rows
    recorded, and not at all where they recorded none (measured before rows did)."""
    stale = []
    here = _device_name()
    devices = {e["id"]: e["device"] for e in table.devices}
    # every hash the rows hold: with several devices each brings its own newest (tuner/fit.py `load_table`)
    for name, h in sorted({(r.variant, r.variant_hash) for r in table.rows.values()}):
        try:
            v = registry.get(table.definition, name)
        except KeyError:
            continue
        current = v.provenance
        if v.backend == "library" and here != table.env.get("device"):
            versions = next((r.metrics["library_versions"] for (n, _), r in table.rows.items()
                             if n == name and r.variant_hash == h and "library_versions" in (r.metrics or {})), None)
            if versions is None:
                continue
            current = provenance.digest(v.name, v.files, versions)
        if current != h and name not in stale:
            stale.append(name)
            # which GPUs' rows: a joint table's other devices can only be re-tuned on those GPUs
            where = ", ".join(sorted({devices[r.env] for (n, _), r in table.rows.items()
                                      if n == name and r.variant_hash == h and r.env in devices}))
            stream.write(f"[{step}] warning: {defs.get(table.definition).short} {name}: provenance changed since "
                         f"it was measured{f' on {where}' if where else ''} ({h} -> {current}); re-run "
                         f"`kdispatch tune`{' there' if where else ''}\n")
    return stale


def _device_name() -> str | None:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def summarize(policy, path) -> str:
    h = policy.heldout or {}
    lines = [f"[route] {path}: {len(policy.regions)} region(s), baseline {policy.baseline}"]
    for i, r in enumerate(policy.regions, 1):
        cond = codegen._cond(policy.definition, r.bounds) or "every shape"
        sp = "" if r.variant == policy.baseline else f" {codegen._speedup(r.stats)}"
        lines.append(f"[route]   {i}. {cond}: {r.variant} ({len(r.uuids)} workloads){sp}")
    if h.get("workloads"):
        lines.append(f"[route]   held-out ({h['folds']}-fold): {_regret_text(h, '[route]')}")
    return "\n".join(lines)


def open_stores(paths=None) -> Store:
    """One in-memory view of several stores (default: every store under tuner/results/)."""
    if paths:
        files = [Path(p) for p in paths]
    else:
        files = stores_in(RESULTS_DIR)
    if len(files) == 1:
        return Store.open(files[0])
    import tempfile

    merged = Store(":memory:")
    with tempfile.TemporaryDirectory() as tmp:
        for i, f in enumerate(files):
            dump = Store.open(f).dump_jsonl(Path(tmp) / f"{i}.jsonl")
            merged.load_jsonl(dump)
    return merged


def bench(roots, *, definitions=None, variants=None, device: str = "cuda", quick: bool = False,
          trials: int | None = None, timeout: float = 300.0, stream=None, in_process: bool | None = None,
          max_minutes: float | None = None) -> tuple[Store, dict]:
    """Measures every variant that runs here (or only `variants`; the baseline always) and the routed
    op on a workload set (in memory). `max_minutes`: stop measuring after this long, keeping what was
    measured (info["complete"] False, info["pending"] the pairs left), so that a time-limited command
    still reports."""
    stream = stream or sys.stderr
    devices = parse_devices(device)
    env = detect_environment(devices)
    store = Store(":memory:")
    eid = store.add_env(env)
    names = [defs.resolve_name(d) for d in (definitions or defs.names())]
    plans = [plan(store, eid, env["arch"], roots, d, variants, quick, True, include_routed=True) for d in names]
    info = {p.definition: p for p in plans}

    def on_row(definition: str, row: dict) -> None:
        v = info[definition].variants[row["variant"]]
        store.put(_result(eid, definition, v, row))

    total = sum(len(p.pending) for p in plans)
    # every variant and the routed op of a workload measured together: their eager times in turns
    jobs = make_jobs(plans, len(devices), "cuda:0" if devices != ["cpu"] else "cpu", quick, trials, eager_turns=True)
    deadline = time.monotonic() + 60 * max_minutes if max_minutes else None
    complete = execute(jobs, devices, on_row, Progress(total, stream, "bench"), in_process=in_process,
                       timeout=timeout, deadline=deadline)
    measured = sum(len(store.results(d, eid)) for d in names)
    return store, {"env": env, "definitions": names, "env_id": eid, "complete": complete,
                   "pending": max(total - measured, 0)}


def _result(env_id: str, definition: str, v: dict, row: dict) -> Result:
    """A worker's measurement row as a store Result (v: the planned variant's hash, role, backend)."""
    return Result(env=env_id, definition=definition, variant=row["variant"], variant_hash=v["hash"],
                  uuid=row["uuid"], axes=row["axes"], status=row["status"], measured_at=row["measured_at"],
                  baseline=v["baseline"], backend=v["backend"], reason=row.get("reason", ""),
                  max_abs_err=row.get("max_abs_err"), max_rel_err=row.get("max_rel_err"),
                  metrics=row.get("metrics", {}), method=row.get("method", ""),
                  median_us=row.get("median_us"), p10_us=row.get("p10_us"), p90_us=row.get("p90_us"),
                  eager_us=row.get("eager_us"), eager_p10_us=row.get("eager_p10_us"),
                  eager_p90_us=row.get("eager_p90_us"), sets=row.get("sets"), reps=row.get("reps"))

ROUTED = ("routed", ROUTED_HINTED)  # the bench's pseudo-variants: the op, and the op given its call-time hints


def regret(by: dict, names: list[str], base: str, u: str, mode: str, min_gain: float,
           routed: str = "routed") -> dict | None:
    """The routed op (`routed`: or ROUTED_HINTED) on workload u in `mode` against the best passing
    variant measured there and the baseline: {"regret": routed / best - 1, "speedup": baseline /
    routed, "slower": bool, never where the routed op served the baseline itself, "behind_baseline":
    bool, only there (slower than the baseline's own call beyond the same margin: drift, or a cost of
    the op's path such as a guard or a copy, to look into), "handed_back": bool}; None when the routed
    op or the baseline has no time in that mode.

    Where the routed op's region hands calls back (`hand_back`: it beat the guarded baseline that
    `kdispatch.ops` runs, not the engine's own call), an engine plugin calls the engine's kernel,
    so its users get the baseline itself; the routed op there serves `kdispatch.ops` callers, whose
    alternative is the guarded call: speedup and "slower" are taken against that."""
    meta = by[(routed, u)].metrics if (routed, u) in by else {}
    back = bool(meta.get("hands_back" if mode == "graph" else "hands_back_eager"))
    rt, b = timed(by.get((routed, u)), mode), timed(by.get((base, u)), mode, guarded=back)
    if rt is None or b is None or rt.median_us <= 0:
        return None
    # graph: only variants that can be captured (or the baseline) count as candidates
    best = min(t.median_us for n in names if n not in ROUTED and (t := timed(by.get((n, u)), mode)) is not None
               and (mode == "eager" or n == base or by[(n, u)].routable))
    # Served by the baseline itself, the routed op is the baseline's call plus dispatch (measured on
    # its own, benchmarks/dispatch_overhead.py): a difference here is drift between two measurements.
    served = meta.get("routed_to" if mode == "graph" else "routed_to_eager")
    behind = slower(rt, b, min_gain)
    return {"regret": rt.median_us / best - 1.0, "speedup": b.median_us / rt.median_us,
            "slower": served != base and behind, "behind_baseline": served == base and behind, "handed_back": back}


def bench_table(store: Store, env_id: str, definition: str,
                min_gain: float = fitting.FitParams.min_gain) -> tuple[list[str], dict]:
    """Text table (one row per workload) and a summary for one definition of a bench store, per call
    mode: regret of the routed op against the best passing variant on each workload (mean, max;
    only meaningful when the bench measured every variant) and the count slower than the baseline;
    where the bench also called the op with the workloads' call-time hints, the same for those calls
    (summary "hinted", the table's last columns).

    "Slower than the baseline" is the fitter's noise margin (tuner/stats.py), never counted where the
    routed op called the baseline's own kernel: there it should differ by run-to-run drift only, and
    a gap beyond the margin is counted apart ("behind_baseline", marked "behind") to look into
    (H200, 2026-11-28: prefill 3 x 14,504 tokens eagerly, 533 us through the op, 319 us calling the
    same variant directly)."""
    rows = store.results(definition, env_id)
    if not rows:
        return [], {}
    base = next(r.variant for r in rows if r.baseline)
    present = [n for n in ROUTED if any(r.variant == n for r in rows)]
    names = [base] + sorted({r.variant for r in rows} - {base, *ROUTED}) + present
    by = {(r.variant, r.uuid): r for r in rows}
    axes_of = {r.uuid: r.axes for r in rows}
    fit_names = features.fit_names(definition)
    uuids = sorted(axes_of, key=lambda u: (tuple(features.compute(definition, axes_of[u])[f] for f in fit_names), u))
    axes_names = features.var_axes(definition)
    head = "  ".join(f"{a:>13}" for a in axes_names) + "  " + "  ".join(f"{n[:22]:>22}" for n in names) + "".join(
        f"  {n + ': routed_to':<24}  {'/base':<12}  {'eager: routed_to':<24}  {'/base':<12}" for n in present)
    lines = [head]
    per_mode = {(n, m): [] for n in present for m in MODES}
    slower_ones = {(n, m): [] for n in present for m in MODES}
    for u in uuids:
        ax = axes_of[u]
        cells = []
        for n in names:
            r = by.get((n, u))
            cells.append(f"{'FAIL ' + r.status[:12] if r is not None and not r.passed else (f'{r.median_us:.2f}' if r else '-'):>22}")
        tail = ""
        for routed in present:
            rt = by.get((routed, u))
            for mode in MODES:
                x = regret(by, names, base, u, mode, min_gain, routed) if rt is not None else None
                ratio = ""
                if x is not None:
                    per_mode[(routed, mode)].append(x)
                    ratio = f"{x['speedup']:.3f}x" + (" (guarded)" if x["handed_back"] else "") + \
                        ("  SLOWER" if x["slower"] else "") + ("  behind" if x["behind_baseline"] else "")
                    if x["slower"]:
                        slower_ones[(routed, mode)].append(u)
                key = "routed_to" if mode == "graph" else "routed_to_eager"
                to = (rt.metrics.get(key, "?") if rt is not None else "-")
                tail += f"  {to:<24}  {ratio:<12}"
        lines.append("  ".join(f"{ax.get(a, ''):>13}" for a in axes_names) + "  " + "  ".join(cells) + tail.rstrip())
    summary = {"workloads": len(uuids), "baseline": base, "routed_failures": sum(
        1 for u in uuids for n in present if by.get((n, u)) is not None and not by[(n, u)].passed)}
    for routed in present:
        into = summary if routed == "routed" else summary.setdefault("hinted", {})
        for mode in MODES:
            xs = per_mode[(routed, mode)]
            into[mode] = {
                "routed_geomean_speedup": round(geomean(x["speedup"] for x in xs), 3) if xs else None,
                "regret_mean_pct": round(100 * sum(x["regret"] for x in xs) / len(xs), 2) if xs else None,
                "regret_max_pct": round(100 * max(x["regret"] for x in xs), 2) if xs else None,
                "slower_than_baseline": len(slower_ones[(routed, mode)]),
                "behind_baseline": sum(x["behind_baseline"] for x in xs),
                "handed_back": sum(x["handed_back"] for x in xs)}
    if "routed" in present:
        peers = peer_summary(by, uuids, min_gain)
        if peers:
            summary["peers"] = peers
    return lines, summary


def peer_summary(by: dict, uuids: list[str], min_gain: float) -> dict:
    """The routed op against each library-backed variant a bench measured besides the baseline (the
    engines' and libraries' kernels: the peers issue's tables), per call mode, over the workloads
    where both have a time (graph: a peer that cannot be captured is left out, the routed op could
    not call it there): geomean and min of peer time / routed time, and the workloads where the
    routed op is slower than the peer beyond the fitter's noise margin."""
    peers = sorted({n for (n, _u), r in by.items() if r.backend == "library" and not r.baseline})
    out = {}
    for p in peers:
        out[p] = {}
        for mode in MODES:
            ratios, slow = [], 0
            for u in uuids:
                rt, pt = timed(by.get(("routed", u)), mode), timed(by.get((p, u)), mode)
                if rt is None or pt is None or (mode == "graph" and not by[(p, u)].routable):
                    continue
                ratios.append(pt.median_us / rt.median_us)
                slow += slower(rt, pt, min_gain)
            out[p][mode] = {"workloads": len(ratios),
                            "routed_geomean_speedup": round(geomean(ratios), 3) if ratios else None,
                            "routed_min_speedup": round(min(ratios), 3) if ratios else None,
                            "slower_than_peer": slow}
    return out
