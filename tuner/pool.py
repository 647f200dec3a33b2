"""Worker processes (one per GPU), the progress line, and recovery from crashes and hangs.

Jobs (tuner/plan.py) go to one worker process per GPU (multiprocessing spawn,
CUDA_VISIBLE_DEVICES = that GPU), which runs `Job.executor` (tuner/job.py `run_job`) and sends
every result row back as it exists. A worker that dies (segfault, an illegal address that broke
the CUDA context) or stays silent for `timeout` seconds (a hang) is killed; the variant it was
running is recorded as failed (RUNTIME_ERROR / TIMEOUT) on that workload and as not measured on
its remaining workloads of the job, and a fresh worker continues with the rest.
"""
from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from typing import Callable

from kdispatch import definitions as defs
from kdispatch.checks import PASSED, RUNTIME_ERROR, TIMEOUT

from .job import Job, now
from .plan import JOB_IDS
from .store import screened_of


# ----------------------------------------------------------------------------------------------
# Progress
# ----------------------------------------------------------------------------------------------

def _outcome(row: dict) -> tuple[bool, bool]:
    """(passed, screened out) of a worker's result row."""
    return row["status"] == PASSED, screened_of(row["status"], row.get("metrics")) is not None


class Progress:
    """A one-line progress bar with ETA on stderr (a line every few seconds when not a terminal)."""

    def __init__(self, total: int, stream=None, label: str = "tune"):
        self.total, self.done, self.failed, self.screened = total, 0, 0, 0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.monotonic()
        self.last = 0.0
        self.label = label

    def update(self, definition: str, variant: str, ok: bool, screened: bool = False) -> None:
        """One pair done: passed (ok), left out by the screen (several times slower: not a failure), or failed."""
        self.done += 1
        self.screened += 1 if screened else 0
        self.failed += 0 if ok or screened else 1
        t = time.monotonic()
        if self.done < self.total and t - self.last < (0.2 if self.tty else 10.0):
            return
        self.last = t
        el = t - self.t0
        eta = el / self.done * (self.total - self.done) if self.done else 0.0
        pct = 100.0 * self.done / max(self.total, 1)
        bar = "#" * int(pct / 5) + "." * (20 - int(pct / 5))
        short = defs.get(definition).short
        line = (f"[{self.label}] [{bar}] {self.done}/{self.total} ({pct:.0f}%) failed {self.failed}"
                f"{f', screened out {self.screened}' if self.screened else ''}  "
                f"{clock(el)} elapsed, ETA {clock(eta)}  {short} {variant}")
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


def clock(s: float) -> str:
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
            if deadline is not None and time.monotonic() > deadline:
                return False
            def emit(kind, *payload, _job=job):
                if kind == "result":
                    row = payload[0]
                    on_row(_job.definition, row)
                    if progress:
                        progress.update(_job.definition, row["variant"], *_outcome(row))
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
                progress.update(w.job.definition, row["variant"], *_outcome(row))
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
                    progress.note("time budget reached: stopping; the last line says how to measure the rest")
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
               job.quick, job.trials, job.executor, next(JOB_IDS), job.extra)
    return rest


def _fail_all(job: Job, reason: str, on_row, progress) -> None:
    by_uuid = {x["uuid"]: x for x in job.workloads}
    for u, names in job.pending.items():
        for n in names:
            on_row(job.definition, _fail_row(n, by_uuid[u], RUNTIME_ERROR, reason))
            if progress:
                progress.update(job.definition, n, False)
