"""The results store: one SQLite file per device, plus its committed text twin in FlashInfer-Bench's
trace format.

Every measurement is one `result` row keyed by

    (env, definition, variant, variant_hash, uuid)

where `env` names the device (name, SM architecture, driver) and the software (torch, triton,
CUDA, flashinfer) it was measured with. A new or changed variant (new provenance hash), a new
workload (new uuid), a new device or a new library version is a missing key, so it is measured;
everything else is not (`Store.missing`). Old rows are kept: the router compiler picks, per
definition and architecture, the most recently measured environment and, per variant, its most
recently measured hash (see `tuner/fit.py`). A row that a later measurement of the same variant on
the same workload and environment under another hash supersedes (code that no longer exists) is
dropped when the tuner writes the store (`Store.drop_superseded`): it would never be fitted on
again, and the twin travels to the GPU machine with every call; git keeps its history.

Files. The working store is `tuner/results/<device-slug>.sqlite` (git-ignored, the local index).
After every change the tuner also writes its twin `tuner/results/traces/<device-slug>.jsonl.gz`
(committed, byte-stable): one FlashInfer-Bench `Trace` per result row, sorted, gzip-compressed
(the twins travel to the GPU machine with every call, whose transfer holds 64 MiB: uncompressed they
had reached 39 MB, 2026-11-28), so that `flashinfer_bench.data.TraceSet.from_path` loads kdispatch's
results as they are from a folder holding them decompressed (`zcat`, `read_twin`):
`definition`, `workload` (axes, inputs, uuid), `solution` = the variant's name, `evaluation`
(`status` an `EvaluationStatus`; `environment` = device and library versions; `timestamp`; `log` =
the failure reason or timing note; `correctness` for PASSED and INCORRECT_NUMERICAL; `performance`
for PASSED: the routing latency and the baseline's on the same workload and environment).
Everything else kdispatch keeps about a row goes into ONE extension object per line, `"kdispatch"`
(FlashInfer-Bench's models ignore unknown keys): the architecture and driver, the variant's hash,
backend and baseline role, the timing method, median/p10/p90/eager microseconds, sets and
repetitions, and the gate's metrics and raw errors. Opening a store whose `.sqlite` is missing, or
older than its twin (a teammate's tune pulled from git), merges the twin in first (per key, the
later `measured_at` wins), so `kdispatch route` works on a fresh clone without a GPU.

Schema (SQLite):

    env(id TEXT PK = sha256 of the fields, device, arch, driver, torch, triton, cuda, flashinfer)
    workload(definition, uuid, axes JSON, inputs JSON; PK (definition, uuid))
    result(env, definition, variant, variant_hash, uuid,           -- the key
           axes JSON, baseline 0/1 (the variant was the baseline of (definition, arch) when measured),
           backend, status (FlashInfer-Bench EvaluationStatus), reason,
           max_abs_err, max_rel_err, metrics JSON (per-output errors, matched ratio, ...),
           method ('graph' | 'events' | 'events:capture-failed' | 'events:work-escaped' | 'cpu'),
           median_us, p10_us, p90_us        -- per-call latency used for routing (graph replay when
                                            -- method = 'graph', CUDA events around eager calls else)
           eager_us,                         -- host + device wall time of one synchronised eager call
           sets, reps,                       -- rotated input sets per graph, timed repetitions
           measured_at TEXT (ISO, UTC),
           eager_p10_us, eager_p90_us)       -- the eager time's 10th / 90th percentile (NULL in rows
                                             -- measured before they were kept)
"""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from kdispatch.checks import INCORRECT_NUMERICAL, PASSED, STATUSES, TIMEOUT

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCHEMA_VERSION = 1
ENV_FIELDS = ("device", "arch", "driver", "torch", "triton", "cuda", "flashinfer")

LIBS = ("torch", "triton", "cuda", "flashinfer")  # the environment fields a trace's `libs` holds
EXTENSION = "kdispatch"  # the one key of a trace line that FlashInfer-Bench does not define

# Timing methods a non-baseline variant may be routed on. The two "events:" fallbacks mean the
# variant could not be captured in a CUDA graph (it raised) or its work escaped the capture: in a
# serving engine that captures graphs it would crash or silently do nothing.
ROUTABLE_METHODS = ("graph", "events", "cpu")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS env (
    id TEXT PRIMARY KEY, device TEXT NOT NULL, arch TEXT NOT NULL, driver TEXT NOT NULL,
    torch TEXT NOT NULL, triton TEXT NOT NULL, cuda TEXT NOT NULL, flashinfer TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workload (
    definition TEXT NOT NULL, uuid TEXT NOT NULL, axes TEXT NOT NULL, inputs TEXT NOT NULL,
    PRIMARY KEY (definition, uuid));
CREATE TABLE IF NOT EXISTS result (
    env TEXT NOT NULL REFERENCES env(id), definition TEXT NOT NULL, variant TEXT NOT NULL,
    variant_hash TEXT NOT NULL, uuid TEXT NOT NULL,
    axes TEXT NOT NULL, baseline INTEGER NOT NULL DEFAULT 0, backend TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
    max_abs_err REAL, max_rel_err REAL, metrics TEXT NOT NULL DEFAULT '{}',
    method TEXT NOT NULL DEFAULT '', median_us REAL, p10_us REAL, p90_us REAL, eager_us REAL,
    sets INTEGER, reps INTEGER, measured_at TEXT NOT NULL, eager_p10_us REAL, eager_p90_us REAL,
    PRIMARY KEY (env, definition, variant, variant_hash, uuid));
CREATE INDEX IF NOT EXISTS result_by_definition ON result (definition, env);
"""


def screened_of(status: str, metrics: dict | None) -> dict | None:
    """Of a row the tuner's screen left ungated and untimed (tuner/job.py), its rough times
    {"graph_us" (None: not capturable), "eager_us", "best_graph_us", "best_eager_us", "factor"}; else None."""
    return (metrics or {}).get("screen") if status == TIMEOUT else None


@dataclass
class Result:
    env: str
    definition: str
    variant: str
    variant_hash: str
    uuid: str
    axes: dict
    status: str
    measured_at: str
    baseline: bool = False
    backend: str = ""
    reason: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    metrics: dict = field(default_factory=dict)
    method: str = ""
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    eager_us: float | None = None
    sets: int | None = None
    reps: int | None = None
    eager_p10_us: float | None = None
    eager_p90_us: float | None = None

    @property
    def key(self) -> tuple:
        return (self.env, self.definition, self.variant, self.variant_hash, self.uuid)

    @property
    def passed(self) -> bool:
        return self.status == PASSED and self.median_us is not None

    @property
    def screened(self) -> dict | None:
        return screened_of(self.status, self.metrics)

    @property
    def routable(self) -> bool:
        """Correct, timed, and safe to route to inside a CUDA graph."""
        return self.passed and self.method in ROUTABLE_METHODS


_COLUMNS = [f.name for f in dataclasses.fields(Result)]
_JSON_COLUMNS = ("axes", "metrics")


def slug(text: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def env_id(env: dict) -> str:
    blob = json.dumps({k: str(env[k]) for k in ENV_FIELDS}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def default_path(device_name: str) -> Path:
    return RESULTS_DIR / f"{slug(device_name)}.sqlite"


TWIN_SUFFIX = ".jsonl.gz"


def twin_of(path: Path) -> Path:
    """The committed trace twin of a store file: <folder>/traces/<stem>.jsonl.gz."""
    return path.parent / "traces" / f"{path.stem}{TWIN_SUFFIX}"


def store_of(twin: Path) -> Path:
    """The store file a twin belongs to (<folder>/<stem>.sqlite for <folder>/traces/<stem>.jsonl.gz)."""
    return twin.parent.parent / f"{twin.name[:-len(TWIN_SUFFIX)]}.sqlite"


def stores_in(folder: Path) -> list[Path]:
    """The stores of a results folder: its .sqlite files and those its committed twins stand for."""
    return sorted(set(folder.glob("*.sqlite")) | {store_of(t) for t in folder.glob(f"traces/*{TWIN_SUFFIX}")})


def read_twin(path: Path) -> str:
    """The trace lines of a twin (or of a plain .jsonl dump)."""
    data = Path(path).read_bytes()
    return (gzip.decompress(data) if str(path).endswith(".gz") else data).decode()


def _round(x):
    return None if x is None else float(f"{x:.6g}")


def _canon(obj):
    """JSON-able with floats rounded to 6 significant digits (byte-stable dumps)."""
    if isinstance(obj, float):
        return _round(obj) if obj == obj and obj not in (float("inf"), float("-inf")) else repr(obj)
    if isinstance(obj, dict):
        return {str(k): _canon(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_canon(v) for v in obj]
    return obj


class Store:
    """A results store backed by one SQLite database (a file, or ":memory:")."""

    def __init__(self, path: str | Path = ":memory:"):
        self.path = Path(path) if str(path) != ":memory:" else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path) if self.path is not None else ":memory:")
        self.db.executescript(_SCHEMA)
        have = {row[1] for row in self.db.execute("PRAGMA table_info(result)")}
        for column in ("eager_p10_us", "eager_p90_us"):  # added after schema 1's first stores
            if column not in have:
                self.db.execute(f"ALTER TABLE result ADD COLUMN {column} REAL")
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        self.db.commit()

    # ---- opening, text twin -------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> "Store":
        """Open (or create) `path`, first merging its twin when that is new to it."""
        path = Path(path)
        if path.name.endswith(TWIN_SUFFIX) or path.suffix == ".jsonl":  # the twin itself: its store sits one folder up
            if path.parent.name != "traces" or path.suffix == ".jsonl":
                raise ValueError(f"{path}: a store's twin lives in <folder>/traces/<name>{TWIN_SUFFIX}; give that "
                                 "file or the store's .sqlite")
            path = store_of(path)
        store = cls(path)
        twin = twin_of(path)
        if twin.exists():
            digest = hashlib.sha256(read_twin(twin).encode()).hexdigest()
            if store.meta("jsonl_digest") != digest:
                store.load_jsonl(twin)
                store.set_meta("jsonl_digest", digest)
        return store

    @property
    def twin(self) -> Path | None:
        return None if self.path is None else twin_of(self.path)

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        self.db.commit()

    def dump_jsonl(self, path: str | Path | None = None) -> Path:
        """Writes every result as a FlashInfer-Bench trace line, sorted (byte-stable for equal data),
        gzip-compressed where the path ends in .gz (the twin)."""
        path = Path(path) if path is not None else self.twin
        if path is None:
            raise ValueError("an in-memory store needs an explicit dump path")
        envs = {e["id"]: e for e in self.envs()}
        workloads = {}
        for d, u, axes, inputs in self.db.execute("SELECT definition, uuid, axes, inputs FROM workload"):
            workloads[(d, u)] = {"axes": json.loads(axes), "inputs": json.loads(inputs), "uuid": u}
        rows = self.results()
        base: dict[tuple, Result] = {}  # the newest passing baseline row per (env, definition, workload)
        for r in rows:
            k = (r.env, r.definition, r.uuid)
            if r.baseline and r.passed and (k not in base or r.measured_at > base[k].measured_at):
                base[k] = r
        lines = sorted(((r.definition, r.variant, r.variant_hash, r.uuid, r.env),
                        _trace_line(r, envs[r.env], workloads.get((r.definition, r.uuid)),
                                    base.get((r.env, r.definition, r.uuid)))) for r in rows)
        text = "".join(json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n" for _, line in lines)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name.endswith(".gz"):
            path.write_bytes(gzip.compress(text.encode(), mtime=0))  # no timestamp: byte-stable
        else:
            path.write_text(text)
        if self.path is not None and path == self.twin:
            self.set_meta("jsonl_digest", hashlib.sha256(text.encode()).hexdigest())
        return path

    def drop_superseded(self) -> int:
        """Deletes every row whose (env, definition, variant, uuid) has a later measurement under
        another hash; returns how many."""
        cur = self.db.execute(
            "DELETE FROM result WHERE EXISTS (SELECT 1 FROM result AS newer WHERE newer.env = result.env "
            "AND newer.definition = result.definition AND newer.variant = result.variant "
            "AND newer.uuid = result.uuid AND newer.variant_hash != result.variant_hash "
            "AND newer.measured_at > result.measured_at)")
        self.db.commit()
        return cur.rowcount

    def load_jsonl(self, path: str | Path) -> None:
        """Merges a trace twin in: environments and workloads are upserted; per result key the
        later row wins."""
        for n, line in enumerate(read_twin(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                env, workload, r = _from_trace_line(json.loads(line))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{n}: not a kdispatch trace line ({type(exc).__name__}: {exc}); "
                                 f"each line needs the {EXTENSION!r} extension object") from None
            r.env = self.add_env(env, commit=False)
            self.put_workload(r.definition, r.uuid, workload["axes"], workload.get("inputs", {}), commit=False)
            old = self.get(r.key)
            if old is None or old.measured_at <= r.measured_at:
                self.put(r, commit=False)
        self.db.commit()

    # ---- environments and workloads ----------------------------------------------------------
    def add_env(self, env: dict, commit: bool = True) -> str:
        missing = [k for k in ENV_FIELDS if k not in env]
        if missing:
            raise ValueError(f"environment lacks {missing}")
        eid = env_id(env)
        self.db.execute("INSERT OR IGNORE INTO env VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (eid, *(str(env[k]) for k in ENV_FIELDS)))
        if commit:
            self.db.commit()
        return eid

    def envs(self) -> list[dict]:
        cur = self.db.execute(f"SELECT id, {', '.join(ENV_FIELDS)} FROM env ORDER BY id")
        return [dict(zip(("id", *ENV_FIELDS), row)) for row in cur]

    def env(self, eid: str) -> dict:
        for e in self.envs():
            if e["id"] == eid:
                return e
        raise KeyError(f"no environment {eid!r} in the store")

    def put_workload(self, definition: str, uuid: str, axes: dict, inputs: dict | None = None,
                     commit: bool = True) -> None:
        self.db.execute("INSERT OR REPLACE INTO workload VALUES (?, ?, ?, ?)",
                        (definition, uuid, json.dumps(axes, sort_keys=True),
                         json.dumps(_canon(inputs or {}), sort_keys=True)))
        if commit:
            self.db.commit()

    def workloads(self, definition: str) -> dict[str, dict]:
        """uuid -> {"axes", "inputs", "uuid"} of the workloads recorded for a definition."""
        cur = self.db.execute("SELECT uuid, axes, inputs FROM workload WHERE definition = ? ORDER BY uuid",
                              (definition,))
        return {u: {"uuid": u, "axes": json.loads(a), "inputs": json.loads(i)} for u, a, i in cur}

    # ---- results -----------------------------------------------------------------------------
    def put(self, r: Result, commit: bool = True) -> None:
        if r.status not in STATUSES:
            raise ValueError(f"unknown status {r.status!r}")
        values = []
        for name in _COLUMNS:
            v = getattr(r, name)
            if name in _JSON_COLUMNS:
                v = json.dumps(_canon(v), sort_keys=True)
            elif name == "baseline":
                v = int(bool(v))
            elif isinstance(v, float):
                v = _round(v) if v == v else None
            values.append(v)
        self.db.execute(f"INSERT OR REPLACE INTO result ({', '.join(_COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(_COLUMNS))})", values)
        if commit:
            self.db.commit()

    def put_many(self, rows: Iterable[Result]) -> None:
        for r in rows:
            self.put(r, commit=False)
        self.db.commit()

    def _rows(self, where: str = "", params: tuple = ()) -> list[Result]:
        cur = self.db.execute(f"SELECT {', '.join(_COLUMNS)} FROM result {where} "
                              "ORDER BY definition, variant, variant_hash, uuid, env", params)
        out = []
        for row in cur:
            d = dict(zip(_COLUMNS, row))
            for name in _JSON_COLUMNS:
                d[name] = json.loads(d[name])
            d["baseline"] = bool(d["baseline"])
            out.append(Result(**d))
        return out

    def get(self, key: tuple) -> Result | None:
        rows = self._rows("WHERE env = ? AND definition = ? AND variant = ? AND variant_hash = ? AND uuid = ?", key)
        return rows[0] if rows else None

    def results(self, definition: str | None = None, env: str | None = None) -> list[Result]:
        clauses, params = [], []
        if definition is not None:
            clauses.append("definition = ?")
            params.append(definition)
        if env is not None:
            clauses.append("env = ?")
            params.append(env)
        return self._rows(("WHERE " + " AND ".join(clauses)) if clauses else "", tuple(params))

    def missing(self, env: str, definition: str, variants: dict[str, str], uuids: Iterable[str]
                ) -> list[tuple[str, str]]:
        """The (variant, uuid) pairs with no row for (env, definition, variant, its hash, uuid),
        sorted: `variants` maps each variant name to its current source hash."""
        have = set(self.db.execute("SELECT variant, variant_hash, uuid FROM result WHERE env = ? AND definition = ?",
                                   (env, definition)))
        uuids = sorted(set(uuids))
        return [(name, u) for name in sorted(variants) for u in uuids if (name, variants[name], u) not in have]


# ---- the trace twin's lines ------------------------------------------------------------------

# The row's axes are the trace's workload axes; everything else FlashInfer-Bench has no field for
# (or rounds: errors must be non-negative there) is here.
_EXTENSION_FIELDS = ("variant_hash", "baseline", "backend", "method", "median_us", "p10_us", "p90_us", "eager_us",
                     "sets", "reps", "metrics", "max_abs_err", "max_rel_err", "eager_p10_us", "eager_p90_us")
_LATER_FIELDS = ("eager_p10_us", "eager_p90_us")  # absent from lines written before they existed


def _nonneg(x) -> float:
    """FlashInfer-Bench's correctness errors are non-negative or NaN; unknown is 0."""
    if x is None:
        return 0.0
    return x if x != x or x >= 0 else 0.0


def _trace_line(r: Result, env: dict, workload: dict | None, base: Result | None) -> dict:
    """One result row as a FlashInfer-Bench Trace (plus the kdispatch extension object)."""
    ev = {"status": r.status, "timestamp": r.measured_at, "log": r.reason,
          "environment": {"hardware": env["device"], "libs": {k: env[k] for k in LIBS}}}
    if r.status in (PASSED, INCORRECT_NUMERICAL):
        ev["correctness"] = {"max_absolute_error": _nonneg(r.max_abs_err), "max_relative_error": _nonneg(r.max_rel_err),
                             "extra": None}
    if r.status == PASSED:
        lat = (r.median_us or 0.0) / 1e3
        ref = (base.median_us or 0.0) / 1e3 if base is not None else 0.0
        ev["performance"] = {"latency_ms": lat, "reference_latency_ms": ref,
                             "speedup_factor": ref / lat if lat > 0 and ref > 0 else 0.0}
    ext = {k: getattr(r, k) for k in _EXTENSION_FIELDS}
    ext["env"] = {"arch": env["arch"], "driver": env["driver"]}
    return _canon({"definition": r.definition, "solution": r.variant, "evaluation": ev,
                   "workload": workload or {"axes": r.axes, "inputs": {}, "uuid": r.uuid}, EXTENSION: ext})


def _from_trace_line(x: dict) -> tuple[dict, dict, Result]:
    """(environment, workload, Result) of one twin line (the Result's env id is filled by the caller)."""
    ev, ext = x["evaluation"], x[EXTENSION]
    env = {"device": ev["environment"]["hardware"], **ev["environment"]["libs"], **ext["env"]}
    fields = {k: ext[k] if k not in _LATER_FIELDS else ext.get(k) for k in _EXTENSION_FIELDS}
    for k in ("max_abs_err", "max_rel_err", "median_us", "p10_us", "p90_us", "eager_us", *_LATER_FIELDS):
        if isinstance(fields[k], str):  # non-finite floats are stored as their repr
            fields[k] = float(fields[k])
    r = Result(env="", definition=x["definition"], variant=x["solution"], uuid=x["workload"]["uuid"],
               axes=x["workload"]["axes"], status=ev["status"], measured_at=ev["timestamp"], reason=ev.get("log", ""),
               **fields)
    return env, x["workload"], r
