"""The results store: one SQLite file per device, plus its committed text twin.

Every measurement is one `result` row keyed by

    (env, definition, variant, variant_hash, uuid)

where `env` names the device (name, SM architecture, driver) and the software (torch, triton,
CUDA, flashinfer) it was measured with. A new or changed variant (new source hash), a new workload
(new uuid), a new device or a new library version is a missing key, so it is measured; everything
else is not (`Store.missing`). Old rows are kept: the router compiler picks, per definition and
architecture, the most recently measured environment and, per variant, its most recently measured
source hash (see `tuner/fit.py`).

Files. The working store is `tuner/results/<device-slug>.sqlite` (git-ignored); after every change
the tuner also writes `tuner/results/<device-slug>.jsonl`, a sorted, one-row-per-line text dump
that is committed (diffable, byte-stable). Opening a store whose `.sqlite` is missing, or older
than its `.jsonl` (a teammate's tune pulled from git), merges the `.jsonl` in first (per key, the
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
           measured_at TEXT (ISO, UTC))
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

RESULTS_DIR = Path(__file__).resolve().parent / "results"
SCHEMA_VERSION = 1
ENV_FIELDS = ("device", "arch", "driver", "torch", "triton", "cuda", "flashinfer")

# FlashInfer-Bench EvaluationStatus values.
PASSED = "PASSED"
INCORRECT_SHAPE = "INCORRECT_SHAPE"
INCORRECT_NUMERICAL = "INCORRECT_NUMERICAL"
INCORRECT_DTYPE = "INCORRECT_DTYPE"
RUNTIME_ERROR = "RUNTIME_ERROR"
COMPILE_ERROR = "COMPILE_ERROR"
TIMEOUT = "TIMEOUT"
STATUSES = (PASSED, INCORRECT_SHAPE, INCORRECT_NUMERICAL, INCORRECT_DTYPE, RUNTIME_ERROR, COMPILE_ERROR, TIMEOUT)

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
    sets INTEGER, reps INTEGER, measured_at TEXT NOT NULL,
    PRIMARY KEY (env, definition, variant, variant_hash, uuid));
CREATE INDEX IF NOT EXISTS result_by_definition ON result (definition, env);
"""


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

    @property
    def key(self) -> tuple:
        return (self.env, self.definition, self.variant, self.variant_hash, self.uuid)

    @property
    def passed(self) -> bool:
        return self.status == PASSED and self.median_us is not None

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
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        self.db.commit()

    # ---- opening, text twin -------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> "Store":
        """Open (or create) `path`, first merging its `.jsonl` twin when that is new to it."""
        path = Path(path)
        if path.suffix == ".jsonl":
            path = path.with_suffix(".sqlite")
        store = cls(path)
        twin = path.with_suffix(".jsonl")
        if twin.exists():
            digest = hashlib.sha256(twin.read_bytes()).hexdigest()
            if store.meta("jsonl_digest") != digest:
                store.load_jsonl(twin)
                store.set_meta("jsonl_digest", digest)
        return store

    @property
    def twin(self) -> Path | None:
        return None if self.path is None else self.path.with_suffix(".jsonl")

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        self.db.commit()

    def dump_jsonl(self, path: str | Path | None = None) -> Path:
        """Writes every env, workload and result as sorted JSON lines (byte-stable for equal data)."""
        path = Path(path) if path is not None else self.twin
        if path is None:
            raise ValueError("an in-memory store needs an explicit dump path")
        lines = []
        for e in self.envs():
            lines.append({"kind": "env", **e})
        for d, u, axes, inputs in self.db.execute("SELECT definition, uuid, axes, inputs FROM workload"):
            lines.append({"kind": "workload", "definition": d, "uuid": u, "axes": json.loads(axes),
                          "inputs": json.loads(inputs)})
        for r in self.results():
            lines.append({"kind": "result", **_canon(dataclasses.asdict(r))})
        order = {"env": 0, "workload": 1, "result": 2}
        lines.sort(key=lambda x: (order[x["kind"]], x.get("id", ""), x.get("definition", ""), x.get("variant", ""),
                                  x.get("variant_hash", ""), x.get("uuid", ""), x.get("env", "")))
        text = "".join(json.dumps(x, sort_keys=True, separators=(",", ":")) + "\n" for x in lines)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if self.path is not None and path == self.twin:
            self.set_meta("jsonl_digest", hashlib.sha256(text.encode()).hexdigest())
        return path

    def load_jsonl(self, path: str | Path) -> None:
        """Merges a dump in: envs and workloads are upserted; per result key the later row wins."""
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            x = json.loads(line)
            kind = x.pop("kind")
            if kind == "env":
                x.pop("id", None)
                self.add_env(x)
            elif kind == "workload":
                self.put_workload(x["definition"], x["uuid"], x["axes"], x.get("inputs", {}), commit=False)
            elif kind == "result":
                r = Result(**{k: v for k, v in x.items() if k in _COLUMNS})
                old = self.get(r.key)
                if old is None or old.measured_at <= r.measured_at:
                    self.put(r, commit=False)
        self.db.commit()

    # ---- environments and workloads ----------------------------------------------------------
    def add_env(self, env: dict) -> str:
        missing = [k for k in ENV_FIELDS if k not in env]
        if missing:
            raise ValueError(f"environment lacks {missing}")
        eid = env_id(env)
        self.db.execute("INSERT OR IGNORE INTO env VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (eid, *(str(env[k]) for k in ENV_FIELDS)))
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

    def delete(self, env: str | None = None, definition: str | None = None, variant: str | None = None) -> int:
        """Forget results (e.g. `tune --force`); returns the number of rows removed."""
        clauses, params = [], []
        for col, val in (("env", env), ("definition", definition), ("variant", variant)):
            if val is not None:
                clauses.append(f"{col} = ?")
                params.append(val)
        cur = self.db.execute("DELETE FROM result" + ((" WHERE " + " AND ".join(clauses)) if clauses else ""), params)
        self.db.commit()
        return cur.rowcount

    # ---- FlashInfer-Bench traces -------------------------------------------------------------
    def export_traces(self, out_dir: str | Path, definitions: Iterable[str] | None = None) -> list[Path]:
        """Writes `<out_dir>/traces/<op_type>/<definition>.jsonl`: one FlashInfer-Bench Trace per
        result row (solution = the variant name), validated with flashinfer_bench's models when
        that package is installed. `reference_latency_ms` is the latency of the definition's
        baseline on that (device, versions, workload) — the reference where no library runs —
        and `speedup_factor` = reference_latency_ms / latency_ms. Also writes the definitions
        (and the workloads the store knows) when `out_dir` lacks them, so the folder is a TraceSet.
        """
        from kdispatch import definitions as defs

        try:
            from flashinfer_bench.data import Trace
        except ImportError:  # the format is still written; only the validation is skipped
            Trace = None
        out_dir = Path(out_dir)
        envs = {e["id"]: e for e in self.envs()}
        names = sorted({r.definition for r in self.results()} if definitions is None
                       else {defs.resolve_name(d) for d in definitions})
        written = []
        for name in names:
            op_type = defs.load(name)["op_type"]
            rows = self.results(name)
            base = {(r.env, r.uuid): r for r in rows if r.baseline and r.passed}
            known = self.workloads(name)
            lines = []
            for r in rows:
                e = envs[r.env]
                w = known.get(r.uuid) or {"uuid": r.uuid, "axes": r.axes, "inputs": {}}
                ev = {"status": r.status, "timestamp": r.measured_at,
                      "environment": {"hardware": e["device"], "libs": {k: e[k] for k in
                                                                         ("torch", "triton", "cuda", "flashinfer")}},
                      "log": r.reason}
                if r.status in (PASSED, INCORRECT_NUMERICAL):
                    extra = dict(r.metrics)
                    ev["correctness"] = {"max_absolute_error": _nonneg(r.max_abs_err),
                                         "max_relative_error": _nonneg(r.max_rel_err), "extra": extra or None}
                if r.status == PASSED:
                    lat = (r.median_us or 0.0) / 1e3
                    b = base.get((r.env, r.uuid))
                    ref = (b.median_us or 0.0) / 1e3 if b is not None else 0.0
                    ev["performance"] = {"latency_ms": lat, "reference_latency_ms": ref,
                                         "speedup_factor": (ref / lat) if lat > 0 and ref > 0 else 0.0}
                trace = {"definition": name, "workload": {"axes": w["axes"], "inputs": w["inputs"], "uuid": r.uuid},
                         "solution": r.variant, "evaluation": ev}
                if Trace is not None:
                    trace = Trace.model_validate(trace).model_dump(mode="json")
                lines.append(json.dumps(trace, sort_keys=True))
            path = out_dir / "traces" / op_type / f"{name}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(line + "\n" for line in lines))
            written.append(path)
            dpath = out_dir / "definitions" / op_type / f"{name}.json"
            if not dpath.exists():
                dpath.parent.mkdir(parents=True, exist_ok=True)
                dpath.write_bytes(defs.path(name).read_bytes())
            wpath = out_dir / "workloads" / op_type / f"{name}.jsonl"
            if not wpath.exists() and known:
                wpath.parent.mkdir(parents=True, exist_ok=True)
                wpath.write_text("".join(json.dumps({"definition": name, "workload": w, "solution": None,
                                                     "evaluation": None}, sort_keys=True) + "\n"
                                         for w in known.values()))
        return written


def _nonneg(x):
    if x is None:
        return 0.0
    return x if x != x or x >= 0 else 0.0
