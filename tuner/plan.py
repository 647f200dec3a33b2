"""What to measure: the environment key, and per definition the variants, workloads and the
(variant, workload) pairs the store lacks, cut into jobs for the workers.

A variant that does not run here is left out; the reference is measured only where it is the
baseline (elsewhere it is only the gate's oracle); the baseline always. A variant whose `declines`
refuses a workload's shape is not measured there. Workers get one job per definition, or per chunk
of its workloads when several GPUs share it.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import itertools
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kdispatch import definitions as defs
from kdispatch.arch import device_module
from kdispatch.checks import PASSED
from kdispatch import registry

from . import features
from .job import ROUTED_HINTED, Job
from .store import RESULTS_DIR, Store
from .timing import SLOW_US

ROUTERS_DIR = Path(__file__).resolve().parents[1] / "routers"
QUICK_DIR = RESULTS_DIR / "quick"
QUICK_WORKLOADS = 6
JOB_IDS = itertools.count(1_000_000)  # ids of re-queued jobs (fresh ids: stale messages are ignored)


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
    eager_turns: bool = False  # its eager times in turns (tuner/job.py), as its stored rows on this GPU took them


def trace_roots(roots) -> list[Path]:
    """One trace-set folder, or several, as a list."""
    return [Path(roots)] if isinstance(roots, (str, Path)) else [Path(r) for r in roots]


def workload_dicts(roots, definition: str) -> list[dict]:
    """{"uuid", "axes", "inputs", "root"} of the definition's workloads in one or several trace sets
    (`root`: the set's folder, which stored inputs' paths are relative to)."""
    from kdispatch.workloads import load_workloads

    out, seen = [], {}
    for root in trace_roots(roots):
        for w in load_workloads(root, definition):
            uuid = str(w.uuid)
            if uuid in seen:
                raise ValueError(f"workload {uuid} of {definition} is in both {seen[uuid]} and {root}")
            seen[uuid] = root
            inputs = {k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else dict(v)) for k, v in
                      (w.inputs or {}).items()}
            out.append({"uuid": uuid, "axes": {k: int(v) for k, v in w.axes.items()}, "inputs": inputs,
                        "root": str(root)})
    return out


def quick_subset(definition: str, workloads: list[dict], n: int = QUICK_WORKLOADS) -> list[dict]:
    """n workloads spread evenly over the main feature."""
    main = features.main(definition)
    ws = sorted(workloads, key=lambda w: (features.compute(definition, w["axes"])[main], w["uuid"]))
    if len(ws) <= n:
        return ws
    return [ws[round(i * (len(ws) - 1) / (n - 1))] for i in range(n)]


def plan(store: Store, env_id: str, arch: str, roots, definition: str, variant_names=None,
         quick: bool = False, force: bool = False, include_routed: bool = False,
         include_reference: bool = False, skip=frozenset(), hash_of=None, runs=None) -> Plan:
    """What to measure for `definition`: the variants that run on `arch` (only `variant_names` where
    given, none named in `skip`; the baseline always) on every workload of `roots` the store lacks.
    For planning another machine's tune: `hash_of(variant)`, its source hash as that machine computes
    it, and `runs(variant)`, whether it runs there (default: here)."""
    definition = defs.resolve_name(definition)
    workloads = workload_dicts(roots, definition)
    if quick:
        workloads = quick_subset(definition, workloads)
    base = registry.baseline(definition, arch, runs)
    chosen = {}
    for v in registry.variants(definition):
        if not (runs(v) if runs else v.why_not(arch) is None):
            continue
        if v.name == registry.REFERENCE and v is not base and not include_reference and \
                not (variant_names and v.name in variant_names):
            continue  # the reference never wins where a library runs; it is only the oracle there
        if (variant_names and v.name not in variant_names or v.name in skip) and v is not base:
            continue
        chosen[v.name] = {"hash": hash_of(v) if hash_of else v.provenance, "backend": v.backend,
                          "baseline": v is base, "variant": v}
    if include_routed:
        chosen["routed"] = {"hash": _router_hash(definition, arch, store.env(env_id)["device"]), "backend": "router", "baseline": False,
                            "variant": None}
        if defs.get(definition).spec.hints:  # the op called with each workload's call-time hints too
            chosen[ROUTED_HINTED] = dict(chosen["routed"])
    for w in workloads:
        store.put_workload(definition, w["uuid"], w["axes"], w["inputs"], commit=False)
    store.db.commit()
    uuids = [w["uuid"] for w in workloads]
    hashes = {n: c["hash"] for n, c in chosen.items()}
    pairs = ([(n, u) for n in sorted(hashes) for u in sorted(uuids)] if force
             else store.missing(env_id, definition, hashes, uuids))
    if not force and base.engine_fn is not None and base.name in hashes:
        pairs += _unguarded(store, env_id, definition, base.name, hashes[base.name], uuids, set(pairs))
    axes = {w["uuid"]: w["axes"] for w in workloads}
    pending, skipped = [], 0
    for n, u in pairs:
        v = chosen[n]["variant"]
        if v is not None and v.declines(dict(axes[u])) is not None:
            skipped += 1
            continue
        pending.append((n, u))
    info = {n: {k: c[k] for k in ("hash", "backend", "baseline")} for n, c in chosen.items()}
    return Plan(definition, base.name, info, workloads, pending, skipped)


def retake_plan(store: Store, env_id: str, arch: str, roots, definition: str, quick: bool = False,
                force: bool = False, slow_us: float = float("inf"), hash_of=None, runs=None,
                taken_before: str | None = None, variant_names=None, skip=frozenset()) -> tuple[Plan, dict]:
    """What `tune --eager-turns-only` takes again: on each workload of `roots`, the eager times of every
    store row of this environment that passed, is of the variant's current code and was timed eagerly
    under `slow_us` (tuner/timing.py SLOW_US: slower rows keep their own loop's times in turns too), in
    turns together (tuner/job.py `retake_eager_job`), where the workload's rows took theirs in each
    variant's own loop (half of them or more, or the baseline's), or `force`, or one of them was
    measured before `taken_before` (a UTC time as the store writes it, e.g. 2026-11-29T22:02:00Z: a
    forced retake cut short resumes with its start, where `force` would begin again); those with one
    such row are left out (a turn needs company). On the other workloads, mostly in turns already, the
    rows of own loops (a variant re-measured before a tune took them in turns by itself) and those
    taken in turns without the baseline's call (`unpaired_in_turns`) are taken again alone, with the
    baseline's call for company (tuner/job.py `_companion`), as a tune takes a new variant's: a
    fraction of their workloads' rows. `variant_names`, `skip`: as `plan` (the baseline's rows are
    among them). Returns the plan and {uuid: {variant: the row}} of what it takes again (`hash_of`,
    `runs`: as `plan`)."""
    p = plan(store, env_id, arch, roots, definition, variant_names, quick=quick, force=True, skip=skip,
             hash_of=hash_of, runs=runs)
    wanted = set(p.pending)
    rows: dict[str, dict] = {}
    base_rows = {}
    for r in store.results(p.definition, env_id):
        info = p.variants.get(r.variant)
        if info is None or r.variant_hash != info["hash"]:
            continue
        if r.variant == p.baseline:
            base_rows[r.uuid] = r
        if (r.variant, r.uuid) not in wanted or r.status != PASSED or r.eager_us is None or r.eager_us >= slow_us:
            continue
        rows.setdefault(r.uuid, {})[r.variant] = r

    def mostly_own_loops(by: dict) -> bool:
        own = [n for n, r in by.items() if not taken_in_turns(r)]
        return 2 * len(own) >= len(by) or p.baseline in own

    whole = {u: by for u, by in rows.items() if len(by) > 1 and
             (force or mostly_own_loops(by)
              or (taken_before is not None and any(r.measured_at < taken_before for r in by.values())))}
    # the rest alone, the baseline's call for company (a lone baseline row has none to pair with)
    unpaired = {u: {n: r for n, r in by.items() if n != p.baseline
                    and (not taken_in_turns(r) or unpaired_in_turns(r, p.baseline, base_rows.get(u)))}
                for u, by in rows.items() if u not in whole}
    rows = {**{u: by for u, by in unpaired.items() if by}, **whole}
    pending = [(n, u) for u in sorted(rows) for n in sorted(rows[u])]
    return Plan(p.definition, p.baseline, p.variants, p.workloads, pending, p.skipped_unsupported), rows


def taken_in_turns(row) -> bool:
    """Did the row take its eager times in turns with other calls (tuner/job.py), not in its own loop?"""
    return "eager_turns_s" in (row.metrics or {})


def unpaired_in_turns(row, baseline: str, baseline_row) -> bool:
    """Whether `row` took its eager time in turns without the baseline's call (a tune of new variants
    before tuner/job.py `_companion`) where the baseline's row passed: the eager fit then compares it
    with the baseline's row of another run by the two spreads, not round by round (tuner/fit.py)."""
    return (row.variant != baseline and row.passed and row.eager_us is not None and row.eager_us < SLOW_US
            and taken_in_turns(row)
            and (row.metrics.get("eager_paired") or {}).get("baseline") != baseline
            and baseline_row is not None and baseline_row.passed)


def _unguarded(store: Store, env_id: str, definition: str, base: str, h: str, uuids, planned: set) -> list:
    """A guarded library baseline's passing rows without the guarded call's times (measured before the
    tuner kept them, tuner/job.py): measured again, since the fit needs both (tuner/fit.py)."""
    done = {r.uuid for r in store.results(definition, env_id) if r.variant == base and r.variant_hash == h
            and (not r.passed or (r.metrics or {}).get("guarded"))}
    return [(base, u) for u in sorted(uuids) if u not in done and (base, u) not in planned]


def _router_hash(definition: str, arch: str, device: str) -> str:
    """The routed op's code on `device` (a GPU model's name): the architecture's router and the
    model's own where it has one."""
    paths = [ROUTERS_DIR / arch / f"{definition}.py", ROUTERS_DIR / arch / device_module(device) / f"{definition}.py"]
    found = [p for p in paths if p.exists()]
    return hashlib.sha256(b"".join(p.read_bytes() for p in found)).hexdigest()[:16] if found else "no-router"


def make_jobs(plans: list[Plan], n_workers: int, device: str, quick: bool, trials=None,
              executor: str | None = None, screen: float | None = None, eager_turns: bool = False) -> list[Job]:
    """One job per definition, or per chunk of its workloads when several GPUs share it (the
    chunks interleave the workloads sorted by the main feature, so each gets a spread of sizes).
    `screen`: leave a variant ungated and untimed on a workload where a rough time says it is over
    this factor slower than the fastest (tuner/job.py). `eager_turns`: a workload's variants take
    their eager times together, in turns (tuner/job.py), for every plan, not only those whose
    `eager_turns` says so."""
    jobs = []
    for p in sorted(plans, key=lambda p: (-len(p.pending), p.definition)):
        by_uuid: dict[str, list[str]] = {}
        for n, u in p.pending:
            by_uuid.setdefault(u, []).append(n)
        if not by_uuid:
            continue
        main = features.main(p.definition)
        ws = sorted((w for w in p.workloads if w["uuid"] in by_uuid),
                    key=lambda w: (features.compute(p.definition, w["axes"])[main], w["uuid"]))
        chunks = max(1, min(n_workers, len(ws)))
        for c in range(chunks):
            part = ws[c::chunks]
            job = Job(p.definition, part, {w["uuid"]: by_uuid[w["uuid"]] for w in part}, device, quick, trials,
                      extra={"screen": screen, "baseline": p.baseline} if screen else {})
            if eager_turns or p.eager_turns:  # the baseline: what each eager call is paired with (tuner/job.py)
                job.extra.update(eager_turns=True, baseline=p.baseline)
            if executor:
                job.executor = executor
            jobs.append(job)
    for i, j in enumerate(jobs):
        j.job_id = i
    return jobs
