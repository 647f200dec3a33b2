"""Orchestration: what to measure, worker processes, progress, and the `tune` / `bench` / `route` flows.

`tune`:
  1. the environment (device name, SM, driver; torch, triton, CUDA, flashinfer versions);
  2. per definition, the variants that run here (the reference only where it is the baseline; the
     baseline always) and the workloads of the trace set; the store answers which
     (variant, workload) pairs it lacks for this environment and these source hashes; a variant
     whose `supports` declines a workload's shape is not measured there;
  3. jobs (one definition, a chunk of workloads, the variants pending on each) go to one worker
     process per GPU (multiprocessing spawn, CUDA_VISIBLE_DEVICES = that GPU). A worker
     materialises each workload's inputs once for all pending variants, computes the reference,
     and gates + times each variant (tuner/timing.py `run_job`). Every result row is stored as it
     arrives, so an interrupted tune resumes where it stopped;
  4. a worker that dies (segfault, illegal address that broke the CUDA context) or stays silent
     for `timeout` seconds (a hang) is killed; the variant it was running is recorded as failed
     (RUNTIME_ERROR / TIMEOUT) on that workload and as not measured ("skipped") on its remaining
     workloads of the job, and a fresh worker continues with the rest;
  5. the store's text twin is rewritten and the routers are compiled (tuner/fit.py, codegen.py).
"""
from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import math
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kdispatch import definitions as defs
from kdispatch import registry

from . import codegen, features
from . import fit as fitting
from .store import RESULTS_DIR, RUNTIME_ERROR, TIMEOUT, Result, Store, default_path, slug
from .timing import Job, now

ROUTERS_DIR = Path(__file__).resolve().parents[1] / "routers"
QUICK_DIR = RESULTS_DIR / "quick"
QUICK_WORKLOADS = 6
_JOB_IDS = itertools.count(1_000_000)  # ids of re-queued jobs (fresh ids: stale messages are ignored)


# ----------------------------------------------------------------------------------------------
# Environment
# ----------------------------------------------------------------------------------------------

def _version(*dists: str) -> str:
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def _driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0].strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
    except Exception:
        return "unknown"


def parse_devices(device: str) -> list[str]:
    """'cuda' -> every visible GPU; 'cuda:1' / 'cuda:0,1' -> those; 'cpu' -> ['cpu']."""
    if device == "cpu":
        return ["cpu"]
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device visible (use --device cpu for a CPU dry run)")
    if device in ("cuda", "all"):
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if device.startswith("cuda:"):
        return [f"cuda:{int(i)}" for i in device[5:].split(",")]
    raise SystemExit(f"--device: expected cuda, cuda:N[,M...] or cpu, got {device!r}")


def detect_environment(devices: list[str]) -> dict:
    """The store's environment key for these devices (the first one; a tune assumes one GPU model)."""
    import torch

    base = {"torch": torch.__version__.split("+")[0], "triton": _version("triton"),
            "cuda": str(torch.version.cuda or "none"), "flashinfer": _version("flashinfer-python", "flashinfer")}
    if devices[0] == "cpu":
        return {"device": platform.processor() or platform.machine() or "cpu", "arch": "cpu", "driver": "none", **base}
    idx = int(devices[0].split(":")[1])
    names = {torch.cuda.get_device_name(int(d.split(":")[1])) for d in devices}
    if len(names) > 1:
        raise SystemExit(f"--device mixes GPU models {sorted(names)}: tune one model at a time")
    major, minor = torch.cuda.get_device_capability(idx)
    return {"device": torch.cuda.get_device_name(idx), "arch": f"sm{major}{minor}", "driver": _driver(), **base}


# ----------------------------------------------------------------------------------------------
# Planning
# ----------------------------------------------------------------------------------------------

@dataclass
class Plan:
    definition: str
    baseline: str
    variants: dict[str, dict]  # name -> {"hash", "backend", "baseline"}
    workloads: list[dict]  # {"uuid", "axes", "inputs"}
    pending: list[tuple[str, str]]  # (variant, uuid)
    skipped_unsupported: int = 0


def workload_dicts(trace_root, definition: str) -> list[dict]:
    from kdispatch.workloads import load_workloads

    out = []
    for w in load_workloads(trace_root, definition):
        inputs = {k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else dict(v)) for k, v in
                  (w.inputs or {}).items()}
        out.append({"uuid": str(w.uuid), "axes": {k: int(v) for k, v in w.axes.items()}, "inputs": inputs})
    return out


def quick_subset(definition: str, workloads: list[dict], n: int = QUICK_WORKLOADS) -> list[dict]:
    """n workloads spread evenly over the main feature."""
    main = features.spec(definition).main
    ws = sorted(workloads, key=lambda w: (features.compute(definition, w["axes"])[main], w["uuid"]))
    if len(ws) <= n:
        return ws
    return [ws[round(i * (len(ws) - 1) / (n - 1))] for i in range(n)]


def _supports(v, axes: dict) -> bool:
    try:
        return bool(v.supports(dict(axes)))
    except Exception:
        return False


def plan(store: Store, env_id: str, arch: str, trace_root, definition: str, variant_names=None,
         quick: bool = False, force: bool = False, include_routed: bool = False,
         include_reference: bool = False) -> Plan:
    definition = defs.resolve_name(definition)
    workloads = workload_dicts(trace_root, definition)
    if quick:
        workloads = quick_subset(definition, workloads)
    base = registry.baseline(definition, arch)
    chosen = {}
    for v in registry.variants(definition):
        if v.why_not(arch) is not None:
            continue
        if v.name == registry.REFERENCE and v is not base and not include_reference and \
                not (variant_names and v.name in variant_names):
            continue  # the reference never wins where a library runs; it is only the oracle there
        if variant_names and v.name not in variant_names and v is not base:
            continue
        chosen[v.name] = {"hash": v.provenance, "backend": v.backend, "baseline": v is base, "variant": v}
    if include_routed:
        chosen["routed"] = {"hash": _router_hash(definition, arch), "backend": "router", "baseline": False,
                            "variant": None}
    for w in workloads:
        store.put_workload(definition, w["uuid"], w["axes"], w["inputs"], commit=False)
    store.db.commit()
    uuids = [w["uuid"] for w in workloads]
    hashes = {n: c["hash"] for n, c in chosen.items()}
    pairs = ([(n, u) for n in sorted(hashes) for u in sorted(uuids)] if force
             else store.missing(env_id, definition, hashes, uuids))
    axes = {w["uuid"]: w["axes"] for w in workloads}
    pending, skipped = [], 0
    for n, u in pairs:
        v = chosen[n]["variant"]
        if v is not None and not _supports(v, axes[u]):
            skipped += 1
            continue
        pending.append((n, u))
    info = {n: {k: c[k] for k in ("hash", "backend", "baseline")} for n, c in chosen.items()}
    return Plan(definition, base.name, info, workloads, pending, skipped)


def _router_hash(definition: str, arch: str) -> str:
    import hashlib

    p = ROUTERS_DIR / arch / f"{definition}.py"
    return hashlib.sha256(p.read_bytes()).hexdigest()[:16] if p.exists() else "no-router"


def make_jobs(plans: list[Plan], n_workers: int, device: str, trace_root, quick: bool, trials=None,
              executor: str | None = None) -> list[Job]:
    """One job per definition, or per chunk of its workloads when several GPUs share it (the
    chunks interleave the workloads sorted by the main feature, so each gets a spread of sizes)."""
    jobs = []
    for p in sorted(plans, key=lambda p: (-len(p.pending), p.definition)):
        by_uuid: dict[str, list[str]] = {}
        for n, u in p.pending:
            by_uuid.setdefault(u, []).append(n)
        if not by_uuid:
            continue
        main = features.spec(p.definition).main
        ws = sorted((w for w in p.workloads if w["uuid"] in by_uuid),
                    key=lambda w: (features.compute(p.definition, w["axes"])[main], w["uuid"]))
        chunks = max(1, min(n_workers, len(ws)))
        for c in range(chunks):
            part = ws[c::chunks]
            job = Job(p.definition, part, {w["uuid"]: by_uuid[w["uuid"]] for w in part}, device,
                      str(trace_root) if trace_root is not None else None, quick, trials)
            if executor:
                job.executor = executor
            jobs.append(job)
    for i, j in enumerate(jobs):
        j.job_id = i
    return jobs


# ----------------------------------------------------------------------------------------------
# Progress
# ----------------------------------------------------------------------------------------------

class Progress:
    """A one-line progress bar with ETA on stderr (a line every few seconds when not a terminal)."""

    def __init__(self, total: int, stream=None, label: str = "tune"):
        self.total, self.done, self.failed = total, 0, 0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.monotonic()
        self.last = 0.0
        self.label = label

    def update(self, definition: str, variant: str, ok: bool) -> None:
        self.done += 1
        self.failed += 0 if ok else 1
        t = time.monotonic()
        if self.done < self.total and t - self.last < (0.2 if self.tty else 10.0):
            return
        self.last = t
        el = t - self.t0
        eta = el / self.done * (self.total - self.done) if self.done else 0.0
        pct = 100.0 * self.done / max(self.total, 1)
        bar = "#" * int(pct / 5) + "." * (20 - int(pct / 5))
        short = defs.FULL_TO_SHORT.get(definition, definition)
        line = (f"[{self.label}] [{bar}] {self.done}/{self.total} ({pct:.0f}%) failed {self.failed}  "
                f"{_clock(el)} elapsed, ETA {_clock(eta)}  {short} {variant}")
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, msg: str) -> None:
        if self.tty:
            self.stream.write("\n")
        self.stream.write(f"[{self.label}] {msg}\n")
        self.stream.flush()


def _clock(s: float) -> str:
    s = int(s)
    return f"{s // 60}:{s % 60:02d}"


# ----------------------------------------------------------------------------------------------
# Execution
# ----------------------------------------------------------------------------------------------

def _resolve(spec) -> Callable:
    """An executor: a callable (in-process runs only), or "module:function"."""
    if callable(spec):
        return spec
    mod, name = spec.split(":")
    return getattr(importlib.import_module(mod), name)


def _worker_main(worker_id: int, conn) -> None:  # runs in the spawned process
    """Receives jobs on `conn`, sends (job_id, kind, payload) back. Pipe writes are synchronous,
    so the parent has every "start" before the variant runs, even if the process then crashes."""
    from . import gate

    while True:
        try:
            job = conn.recv()
        except EOFError:
            break
        if job is None:
            break

        def emit(kind, *payload, _job=job):
            conn.send((_job.job_id, kind, payload))

        code = 0
        try:
            _resolve(job.executor)(job, emit)
            emit("done")
        except gate.ContextLost as exc:
            emit("fatal", str(exc))
            code = 3
        except BaseException as exc:  # a bug or an unexpected error: report, then die like a crash
            emit("fatal", f"worker error: {type(exc).__name__}: {exc}\n{traceback.format_exc()[-1500:]}")
            code = 4
        if code:
            os._exit(code)


class _Worker:
    def __init__(self, ctx, worker_id: int, device: str):
        self.id, self.device = worker_id, device
        self.conn, child = ctx.Pipe(duplex=True)
        env_before = os.environ.get("CUDA_VISIBLE_DEVICES")
        if device.startswith("cuda:"):
            index = int(device.split(":")[1])
            visible = env_before.split(",") if env_before else None
            os.environ["CUDA_VISIBLE_DEVICES"] = visible[index] if visible else str(index)
        try:
            self.proc = ctx.Process(target=_worker_main, args=(worker_id, child), daemon=True)
            self.proc.start()
        finally:
            if env_before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = env_before
        child.close()
        self.job: Job | None = None
        self.done: set = set()
        self.inflight: tuple | None = None
        self.fatal: str | None = None
        self.eof = False
        self.last = time.monotonic()

    def give(self, job: Job) -> None:
        self.job, self.done, self.inflight, self.last = job, set(), None, time.monotonic()
        self.conn.send(job)

    def stop(self, kill: bool = False) -> None:
        if not kill:
            try:
                self.conn.send(None)
            except Exception:
                pass
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
        self.conn.close()


def execute(jobs: list[Job], devices: list[str], on_row: Callable[[str, dict], None],
            progress: Progress | None = None, in_process: bool | None = None, timeout: float = 300.0,
            deadline: float | None = None) -> bool:
    """Runs the jobs; `on_row(definition, row)` receives every result row (failures included).
    Returns False when it stopped at `deadline` (time.monotonic()) with work left: what was not
    measured stays missing in the store, and the next run picks it up."""
    if in_process is None:
        in_process = devices == ["cpu"]
    if in_process:
        for job in jobs:
            def emit(kind, *payload, _job=job):
                if kind == "result":
                    row = payload[0]
                    on_row(_job.definition, row)
                    if progress:
                        progress.update(_job.definition, row["variant"], row["status"] == "PASSED")
            _resolve(job.executor)(job, emit)
        return True
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    workers = [_Worker(ctx, i, d) for i, d in enumerate(devices)]
    todo = list(jobs)
    deaths_without_progress: dict[int, int] = {}

    def handle(w: _Worker, msg) -> None:
        job_id, kind, payload = msg
        if w.job is None or w.job.job_id != job_id:
            return
        w.last = time.monotonic()
        if kind == "start":
            w.inflight = (payload[0], payload[1])
        elif kind == "result":
            row = payload[0]
            w.done.add((row["variant"], row["uuid"]))
            deaths_without_progress[w.id] = 0
            on_row(w.job.definition, row)
            if progress:
                progress.update(w.job.definition, row["variant"], row["status"] == "PASSED")
        elif kind == "done":
            w.job = None
        elif kind == "fatal":
            w.fatal = payload[0]

    def drain(w: _Worker) -> None:
        try:
            while w.conn.poll():
                handle(w, w.conn.recv())
        except (EOFError, OSError):
            w.eof = True

    try:
        while todo or any(w.job is not None for w in workers):
            if deadline is not None and time.monotonic() > deadline:
                if progress:
                    progress.note("time budget reached: stopping; re-run the same command to measure the rest")
                return False
            for w in workers:
                if w.job is None and todo and not w.eof:
                    w.give(todo.pop(0))
            busy = {w.conn: w for w in workers if w.job is not None}
            for c in wait(list(busy), timeout=1.0):
                drain(busy[c])
            for i, w in enumerate(workers):  # deaths and hangs
                if w.job is None and not w.eof:
                    continue
                dead = w.eof or not w.proc.is_alive()
                hung = not dead and time.monotonic() - w.last > timeout
                if not dead and not hung:
                    continue
                if w.job is not None:
                    why = (f"no progress for {timeout:.0f} s (hang)" if hung else
                           w.fatal or f"worker process died (exit code {_exitcode(w)})")
                    status = TIMEOUT if hung else RUNTIME_ERROR
                    w.stop(kill=True)
                    rest = _recover(w, why, status, on_row, progress)
                    deaths_without_progress[w.id] = deaths_without_progress.get(w.id, 0) + 1
                    if progress:
                        progress.note(f"worker {w.id} ({w.device}): {why.splitlines()[0][:200]}; restarting")
                    if rest is not None:
                        if deaths_without_progress[w.id] >= 3:
                            _fail_all(rest, "not measured: the worker died 3 times in a row without progress",
                                      on_row, progress)
                        else:
                            todo.insert(0, rest)
                else:
                    w.stop(kill=True)
                workers[i] = _Worker(ctx, w.id, w.device)
    finally:
        for w in workers:
            w.stop(kill=w.job is not None)
    return True


def _exitcode(w: _Worker):
    w.proc.join(5)
    return w.proc.exitcode


def _fail_row(name: str, w: dict, status: str, reason: str) -> dict:
    return {"variant": name, "uuid": w["uuid"], "axes": dict(w["axes"]), "status": status, "reason": reason[:500],
            "metrics": {}, "measured_at": now()}


def _recover(w: _Worker, why: str, status: str, on_row, progress) -> Job | None:
    """Records the failure of the in-flight item (and skips the rest of the variant it blames);
    returns a job with what is left, or None."""
    job = w.job
    by_uuid = {x["uuid"]: x for x in job.workloads}
    left = {u: [n for n in names if (n, u) not in w.done] for u, names in job.pending.items()}
    blame = None

    def record(name, u, st, reason):
        row = _fail_row(name, by_uuid[u], st, reason)
        on_row(job.definition, row)
        if progress:
            progress.update(job.definition, name, False)
        left[u].remove(name)

    if w.inflight is not None:
        name, u = w.inflight
        if name is None:  # preparing inputs / the reference of workload u
            for n in list(left.get(u, [])):
                record(n, u, status, f"preparing inputs or the reference: {why}")
        else:
            blame = name
            if name in left.get(u, []):
                record(name, u, status, why)
    if blame is not None:
        for u in list(left):
            if blame in left[u]:
                record(blame, u, RUNTIME_ERROR,
                       f"not measured: {blame} broke the worker on workload {w.inflight[1]} earlier in this run")
    pending = {u: ns for u, ns in left.items() if ns}
    if not pending:
        return None
    rest = Job(job.definition, [x for x in job.workloads if x["uuid"] in pending], pending, job.device,
               job.trace_root, job.quick, job.trials, job.executor, next(_JOB_IDS), job.extra)
    return rest


def _fail_all(job: Job, reason: str, on_row, progress) -> None:
    by_uuid = {x["uuid"]: x for x in job.workloads}
    for u, names in job.pending.items():
        for n in names:
            on_row(job.definition, _fail_row(n, by_uuid[u], RUNTIME_ERROR, reason))
            if progress:
                progress.update(job.definition, n, False)


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


def tune(trace_root, *, definitions=None, variants=None, device: str = "cuda", store: Store | str | None = None,
         out=None, quick: bool = False, force: bool = False, trials: int | None = None, env: dict | None = None,
         executor: str | None = None, in_process: bool | None = None, timeout: float = 300.0, stream=None,
         compile_routers: bool = True, max_minutes: float | None = None) -> TuneResult:
    """Measures what the store lacks, then compiles the routers. Returns what it did.

    `max_minutes`: stop measuring after this long (then the store's twin is written and the routers
    compiled from what was measured; re-running resumes). SIGTERM is handled the same way."""
    t0 = time.monotonic()
    stream = stream or sys.stderr
    devices = parse_devices(device)
    env = env or detect_environment(devices)
    if store is None or isinstance(store, (str, Path)):
        path = Path(store) if store is not None else (QUICK_DIR / f"{slug(env['device'])}.sqlite" if quick
                                                      else default_path(env["device"]))
        store = Store.open(path)
    eid = store.add_env(env)
    names = [defs.resolve_name(d) for d in (definitions or defs.names())]
    plans = [plan(store, eid, env["arch"], trace_root, d, set(variants) if variants else None, quick, force)
             for d in names]
    total = sum(len(p.pending) for p in plans)
    progress = Progress(total, stream)
    stream.write(f"[tune] {env['device']} ({env['arch']}), torch {env['torch']}, triton {env['triton']}, "
                 f"CUDA {env['cuda']}, flashinfer {env['flashinfer']}; store {store.path or ':memory:'}\n")
    for p in plans:
        stream.write(f"[tune] {defs.FULL_TO_SHORT[p.definition]}: {len(p.workloads)} workloads, baseline "
                     f"{p.baseline}, variants {', '.join(sorted(p.variants))}; {len(p.pending)} to measure"
                     + (f" ({p.skipped_unsupported} shapes declined by `supports`)" if p.skipped_unsupported else "")
                     + "\n")
    result = TuneResult(env, plans)
    info = {p.definition: p for p in plans}

    def on_row(definition: str, row: dict) -> None:
        p = info[definition]
        v = p.variants[row["variant"]]
        store.put(_result(eid, definition, v, row))
        result.measured.append((definition, row["variant"], row["uuid"]))

    result.complete = True
    if total:
        # Each GPU worker sees exactly its GPU (CUDA_VISIBLE_DEVICES), as cuda:0.
        jobs = make_jobs(plans, len(devices), "cpu" if devices == ["cpu"] else "cuda:0", trace_root, quick,
                         trials, executor)
        deadline = t0 + 60 * max_minutes if max_minutes else None
        previous = signal.signal(signal.SIGTERM, _sigterm) if _main_thread() else None
        try:
            result.complete = execute(jobs, devices, on_row, progress, in_process=in_process, timeout=timeout,
                                      deadline=deadline)
        except KeyboardInterrupt:
            result.complete = False
            stream.write("\n[tune] interrupted: what was measured is stored; re-run to continue\n")
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if store.path is not None:
                store.dump_jsonl()
    elif store.path is not None:
        store.dump_jsonl()
    if compile_routers:
        uuids = {p.definition: [w["uuid"] for w in p.workloads] for p in plans}
        out = out if out is not None else (QUICK_DIR / "routers" if quick else ROUTERS_DIR)
        result.routers = compile_all(store, out, env["arch"], names, uuids, stream=stream)
    result.seconds = time.monotonic() - t0
    left = total - len(result.measured)
    stream.write(f"[tune] measured {len(result.measured)} (variant, workload) pairs in {_clock(result.seconds)}"
                 + (f"; {left} left: re-run the same command to measure them\n" if left > 0 else "\n"))
    return result


def _sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def compile_all(store: Store, out, arch: str | None = None, definitions=None, uuids: dict | None = None,
                stream=None, params: fitting.FitParams | None = None) -> list:
    """Fits and writes a router for every (definition, arch) the store has data for."""
    stream = stream or sys.stderr
    archs = sorted({e["arch"] for e in store.envs()}) if arch is None else [arch]
    names = [defs.resolve_name(d) for d in (definitions or defs.names())]
    done = []
    for a in archs:
        for d in names:
            table = fitting.load_table(store, d, a, (uuids or {}).get(d))
            if table is None:
                continue
            _warn_stale(table, stream)
            policy = fitting.fit(table, params)
            path = codegen.write(policy, out)
            done.append((d, path, policy))
            stream.write(summarize(policy, path) + "\n")
    return done


def _warn_stale(table, stream) -> None:
    try:
        for name, h in sorted(table.hashes.items()):
            try:
                v = registry.get(table.definition, name)
            except KeyError:
                continue
            if v.provenance != h:
                stream.write(f"[route] warning: {defs.FULL_TO_SHORT[table.definition]} {name}: source changed since "
                             f"it was measured ({h} -> {v.provenance}); re-run `kdispatch tune`\n")
    except Exception:
        pass


def summarize(policy, path) -> str:
    h = policy.heldout or {}
    lines = [f"[route] {path}: {len(policy.regions)} region(s), baseline {policy.baseline}"]
    for i, r in enumerate(policy.regions, 1):
        cond = codegen._cond(policy.definition, r.bounds) or "every shape"
        sp = "" if r.variant == policy.baseline else f" {codegen._speedup(r.stats)}"
        lines.append(f"[route]   {i}. {cond}: {r.variant} ({len(r.uuids)} workloads){sp}")
    if h.get("workloads"):
        lines.append(f"[route]   held-out ({h['folds']}-fold): regret {h['regret_mean_pct']:.2f}% mean / "
                     f"{h['regret_max_pct']:.2f}% max, {h['speedup_vs_baseline']:.3f}x over baseline, "
                     f"{h['slower_than_baseline']} slower than baseline, {h['unsafe']} unsafe")
    return "\n".join(lines)


def open_stores(paths=None) -> Store:
    """One in-memory view of several stores (default: every store under tuner/results/)."""
    if paths:
        files = [Path(p) for p in paths]
    else:
        stems = sorted({p.with_suffix("") for p in RESULTS_DIR.glob("*.sqlite")} |
                       {p.with_suffix("") for p in RESULTS_DIR.glob("*.jsonl")})
        files = [s.with_suffix(".sqlite") for s in stems]
    if len(files) == 1:
        return Store.open(files[0])
    import tempfile

    merged = Store(":memory:")
    with tempfile.TemporaryDirectory() as tmp:
        for i, f in enumerate(files):
            dump = Store.open(f).dump_jsonl(Path(tmp) / f"{i}.jsonl")
            merged.load_jsonl(dump)
    return merged


def bench(trace_root, *, definitions=None, variants=None, device: str = "cuda", quick: bool = False,
          trials: int | None = None, timeout: float = 300.0, stream=None, in_process: bool | None = None
          ) -> tuple[Store, dict]:
    """Measures every variant that runs here (or only `variants`; the baseline always) and the routed
    op on a workload set (in memory)."""
    stream = stream or sys.stderr
    devices = parse_devices(device)
    env = detect_environment(devices)
    store = Store(":memory:")
    eid = store.add_env(env)
    names = [defs.resolve_name(d) for d in (definitions or defs.names())]
    plans = [plan(store, eid, env["arch"], trace_root, d, variants, quick, True, include_routed=True) for d in names]
    info = {p.definition: p for p in plans}

    def on_row(definition: str, row: dict) -> None:
        v = info[definition].variants[row["variant"]]
        store.put(_result(eid, definition, v, row))

    total = sum(len(p.pending) for p in plans)
    jobs = make_jobs(plans, len(devices), "cuda:0" if devices != ["cpu"] else "cpu", trace_root, quick, trials)
    execute(jobs, devices, on_row, Progress(total, stream, "bench"), in_process=in_process, timeout=timeout)
    return store, {"env": env, "definitions": names, "env_id": eid}



def _result(env_id: str, definition: str, v: dict, row: dict) -> Result:
    """A worker's measurement row as a store Result (v: the planned variant's hash, role, backend)."""
    return Result(env=env_id, definition=definition, variant=row["variant"], variant_hash=v["hash"],
                  uuid=row["uuid"], axes=row["axes"], status=row["status"], measured_at=row["measured_at"],
                  baseline=v["baseline"], backend=v["backend"], reason=row.get("reason", ""),
                  max_abs_err=row.get("max_abs_err"), max_rel_err=row.get("max_rel_err"),
                  metrics=row.get("metrics", {}), method=row.get("method", ""),
                  median_us=row.get("median_us"), p10_us=row.get("p10_us"), p90_us=row.get("p90_us"),
                  eager_us=row.get("eager_us"), sets=row.get("sets"), reps=row.get("reps"))

def bench_table(store: Store, env_id: str, definition: str,
                min_gain: float = fitting.FitParams.min_gain) -> tuple[list[str], dict]:
    """Text table (one row per workload) and a summary for one definition of a bench store.

    "Slower than the baseline" uses the fitter's noise margin (spread, at least min_gain): the routed
    op calling the baseline's own kernel differs from it by run-to-run drift only."""
    rows = store.results(definition, env_id)
    if not rows:
        return [], {}
    base = next(r.variant for r in rows if r.baseline)
    names = [base] + sorted({r.variant for r in rows} - {base, "routed"}) + (["routed"] if any(
        r.variant == "routed" for r in rows) else [])
    by = {(r.variant, r.uuid): r for r in rows}
    spec = features.spec(definition)
    uuids = sorted({r.uuid for r in rows}, key=lambda u: (tuple(features.compute(definition, by_any(by, u).axes)[f]
                                                                for f in spec.fit), u))
    axes_names = features.var_axes(definition)
    head = "  ".join(f"{a:>13}" for a in axes_names) + "  " + "  ".join(f"{n[:22]:>22}" for n in names) + \
        "  routed_to                 routed/base"
    lines = [head]
    slower, speedups = [], []
    for u in uuids:
        ax = by_any(by, u).axes
        cells = []
        for n in names:
            r = by.get((n, u))
            cells.append(f"{'FAIL ' + r.status[:12] if r is not None and not r.passed else (f'{r.median_us:.2f}' if r else '-'):>22}")
        rt = by.get(("routed", u))
        b = by.get((base, u))
        ratio = ""
        if rt is not None and b is not None and rt.passed and b.passed:
            sp = b.median_us / rt.median_us
            speedups.append(sp)
            ratio = f"{sp:.3f}x"
            margin = fitting._half_width(rt) + fitting._half_width(b) + min_gain * b.median_us
            if rt.median_us > b.median_us + margin:
                slower.append(u)
                ratio += "  SLOWER"
        to = (rt.metrics.get("routed_to", "?") if rt is not None else "-")
        lines.append("  ".join(f"{ax.get(a, ''):>13}" for a in axes_names) + "  " + "  ".join(cells) +
                     f"  {to:<24}  {ratio}")
    summary = {"workloads": len(uuids), "baseline": base,
               "routed_geomean_speedup": (round(math.exp(sum(map(math.log, speedups)) / len(speedups)), 3)
                                          if speedups else None),
               "routed_slower_than_baseline": len(slower), "routed_failures": sum(
                   1 for u in uuids if by.get(("routed", u)) is not None and not by[("routed", u)].passed)}
    return lines, summary


def by_any(by: dict, uuid: str):
    return next(r for (n, u), r in by.items() if u == uuid)
