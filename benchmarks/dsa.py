"""DSA top-k indexer and sparse attention on the contest workloads: the project's reference (the
baseline on sm_90), the official definition's reference code, every kdispatch variant that runs
here, and the routed op, side by side in one run.

Per workload and candidate: correctness through the tuner's gate (kdispatch.tuner.gate), CUDA-graph
time per call with the rotated input (block table or sparse indices moved across the cache, so
the working set exceeds 4x the L2; kdispatch.tuner.timing), eager host + device time per call, and
the HBM floor:
  indexer    sum over sequences of ceil(L/64) * 64 * 132 bytes of cache, plus q, weights, output
  attention  1152 bytes (512 + 64 bf16) per valid selected token, plus q, output and lse
The official reference code is loaded from the definition JSON under ../shared/fib/definitions
(or --official-dir) at run time, never copied; it syncs with the host, so it is timed with events
around eager calls (its graph column stays empty).
Writes benchmarks/results/dsa-<device>.json; prints a per-workload table and a summary last.

    python benchmarks/dsa.py [--definition dsa_topk_indexer|dsa_sparse_attention|all] [--limit N] [--quick]
    python benchmarks/dsa.py --sweep [indexer|attention|cuda]   # indexer time breakdown; Triton or CUDA
                                                                # split-K attention launch configurations
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

import torch

import kdispatch
from kdispatch import definitions, registry
from kdispatch.tuner import gate, timing
from kdispatch.workloads import load_workloads, materialize

from floors import floor_us, peak_bandwidth  # noqa: E402  (benchmarks/ is the script folder)

ROOT = Path(__file__).resolve().parents[1]
OPS = ("dsa_topk_indexer", "dsa_sparse_attention")
OFFICIAL_DIRS = (ROOT.parent / "shared" / "fib" / "definitions", ROOT / ".kd-fib" / "definitions")


def official_call(op: str, official_dir: Path | None):
    """The official reference's `run`, executed from its definition JSON in a fresh namespace."""
    dirs = [official_dir] if official_dir else list(OFFICIAL_DIRS)
    for d in dirs:
        path = d / "dsa_paged" / f"{definitions.resolve_name(op)}.json"
        if path.is_file():
            namespace: dict = {}
            exec(compile(json.loads(path.read_text())["reference"], f"<official {op}>", "exec"), namespace)
            return namespace["run"]
    return None


def candidates(op: str, official_dir: Path | None) -> dict:
    full = op
    here = kdispatch.arch.local_arch()
    out = {"reference": registry.get(full, "reference").fn}
    official = official_call(op, official_dir)
    if official is not None:
        out["official"] = official
    for v in registry.variants(full):
        if v.name != "reference" and v.why_not(here) is None:
            out[v.name] = v.fn
    out["routed"] = getattr(kdispatch.ops, op)
    return out


def supported(op: str, name: str, axes: dict) -> bool:
    v = registry.get(op, name) if name not in ("official", "routed") else None
    return v is None or v.declines(axes) is None


def time_candidate(name: str, fn, sets, quick: bool) -> dict:
    r = {}
    if name == "official":  # host syncs inside: events around eager calls
        r["event_us"] = statistics.median(timing.event_times_us(fn, sets, 3 if quick else 10))
    else:
        times, _ = timing.graph_times_us(fn, sets, 5 if quick else None)
        r["graph_us"] = statistics.median(times)
    r["eager_us"] = statistics.median(timing.eager_times_us(fn, sets, 10 if quick else 50))
    return r


def bench_op(op: str, limit: int | None, quick: bool, official_dir: Path | None) -> list[dict]:
    full = op
    cands = candidates(op, official_dir)
    workloads = load_workloads(ROOT / "traces", full)[:limit]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for w in workloads:
        axes = dict(w.axes)
        args = list(materialize(full, w, device="cuda", seed=0))
        ref = gate.reference(full, args)
        sets = timing.input_sets(full, args, l2, max_sets=4 if quick else timing.MAX_SETS)
        row = {"uuid": w.uuid, "axes": axes, "floor_us": floor_us(op, args, axes), "sets": len(sets),
               "results": {}}
        for name, fn in cands.items():
            if not supported(op, name, axes):
                continue
            r = {}
            try:
                if name != "official":
                    v = gate.run_gate(full, fn, [(args, ref)])
                    r["correct"], r["error"] = v.passed, "" if v.passed else f"{v.status}: {v.reason}"[:300]
                else:
                    r["correct"], r["error"] = True, "(the definition)"
                if r["correct"]:
                    r.update(time_candidate(name, fn, sets, quick))
            except Exception as exc:  # a failing candidate is reported, the run goes on
                r["correct"], r["error"] = False, f"{type(exc).__name__}: {exc}"[:300]
            row["results"][name] = r
        base = row["results"]["reference"].get("graph_us")
        official = row["results"].get("official", {}).get("event_us")
        for r in row["results"].values():
            t = r.get("graph_us")
            if t:
                r["pct_of_floor"] = 100 * row["floor_us"] / t
                r["speedup_vs_reference"] = base / t if base else None
                r["speedup_vs_official"] = official / t if official else None
        rows.append(row)
        cells = "  ".join(f"{k}={v.get('graph_us', v.get('event_us', float('nan'))):.1f}" if v["correct"]
                          else f"{k}=FAIL" for k, v in row["results"].items())
        print(f"{op} {axes} floor={row['floor_us']:.2f}us  {cells}", flush=True)
    return rows


def regime(op: str, axes: dict) -> str:
    if op == "dsa_topk_indexer":
        return "pass-through" if axes["max_num_pages"] * 64 <= 2048 else "scored"
    return "T<=2" if axes["num_tokens"] <= 2 else "T>=6" if axes["num_tokens"] >= 6 else "T=3..5"


def summarize(op: str, rows: list[dict]) -> list[str]:
    lines = [f"\n== {op}: {len(rows)} workloads; graph time (inputs rotated); speedups are means of "
             "per-workload ratios (official: its eager event time)"]
    names = list(dict.fromkeys(n for r in rows for n in r["results"]))
    lines.append(f"{'candidate':<24}{'regime':<14}{'n':>4}{'ok':>4}{'med us':>9}{'max us':>9}{'x ref':>9}"
                 f"{'x official':>12}{'%floor':>8}{'eager med':>11}")
    f = lambda xs, fn=statistics.mean: f"{fn(xs):.2f}" if xs else "n/a"  # noqa: E731
    for name in names:
        for reg in sorted({regime(op, r["axes"]) for r in rows}):
            rs = [r["results"][name] for r in rows if name in r["results"] and regime(op, r["axes"]) == reg]
            if not rs:
                continue
            t = [r.get("graph_us", r.get("event_us")) for r in rs if r.get("graph_us", r.get("event_us"))]
            sp = [r["speedup_vs_reference"] for r in rs if r.get("speedup_vs_reference")]
            so = [r["speedup_vs_official"] for r in rs if r.get("speedup_vs_official")]
            fl = [r["pct_of_floor"] for r in rs if r.get("pct_of_floor")]
            ea = [r["eager_us"] for r in rs if "eager_us" in r]
            ok = sum(r["correct"] for r in rs)
            lines.append(f"{name:<24}{reg:<14}{len(rs):>4}{ok:>4}{f(t, statistics.median):>9}{f(t, max):>9}"
                         f"{f(sp):>9}{f(so):>12}{f(fl):>8}{f(ea, statistics.median):>11}")
    return lines


def attention_shapes(quick: bool):
    """(num_tokens, rotated input sets, HBM floor in us) for one contest workload per num_tokens."""
    full = "dsa_sparse_attention"
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    seen = {}
    for w in load_workloads(ROOT / "traces", full):
        seen.setdefault(w.axes["num_tokens"], w)
    for t, w in sorted(seen.items()):
        args = list(materialize(full, w, device="cuda", seed=0))
        sets = timing.input_sets(full, args, l2, max_sets=4 if quick else timing.MAX_SETS)
        yield t, sets, floor_us("dsa_sparse_attention", args, {"num_tokens": t, "num_pages": args[2].shape[0]})


def sweep_splitk(quick: bool) -> None:
    """Graph time of every (BLOCK_N, NSPLIT, num_warps) of the split-K sparse attention on one
    contest workload per num_tokens, against the launch heuristic's choice."""
    from kdispatch.kernels.triton.dsa import sparse_attention_splitk as S

    for t, sets, floor in attention_shapes(quick):
        res = []
        for bn in (16, 32, 64):
            for ns in (8, 16, 32, 64, 128):
                if 2048 % (bn * ns):
                    continue
                for nw in (4, 8):
                    fn = lambda *a, c=(bn, ns, nw): S.dsa_sparse_attention_splitk(  # noqa: E731
                        *a, BLOCK_N=c[0], NSPLIT=c[1], num_warps=c[2])
                    try:
                        us = statistics.median(timing.graph_times_us(fn, sets, 5 if quick else None)[0])
                    except Exception as exc:
                        print(f"T={t} {bn}/{ns}/{nw}: {type(exc).__name__}")
                        continue
                    res.append((us, bn, ns, nw))
        res.sort()
        default = S.splitk_config(t)
        print(f"T={t} floor={floor:.2f}us default {default}: " +
              ", ".join(f"{bn}/{ns}/{nw}={us:.2f}" for us, bn, ns, nw in res[:6]), flush=True)


def sweep_cuda_splitk(quick: bool) -> None:
    """Graph time of every compiled (splits, stages, groups) of the CUDA split-K sparse attention on
    one contest workload per num_tokens, against the Triton split-K variant's default, in one run."""
    from kdispatch.kernels.cuda.dsa import sparse_attention_splitk as C
    from kdispatch.kernels.triton.dsa import sparse_attention_splitk as S

    for t, sets, floor in attention_shapes(quick):
        fns = {"splitk": S.dsa_sparse_attention_splitk}
        for cfg in C.CONFIGS:
            fns["ns{}s{}g{}".format(*cfg)] = lambda *a, cfg=cfg: C.dsa_sparse_attention_cuda_splitk(*a, cfg=cfg)
        us = {k: statistics.median(timing.graph_times_us(f, sets, 5 if quick else None)[0]) for k, f in fns.items()}
        print(f"T={t} floor={floor:.2f}us default {C.config(t)}: " + " ".join(f"{k}={v:.2f}" for k, v in us.items()),
              flush=True)


def indexer_breakdown(quick: bool) -> None:
    """Graph time of the FP8 scoring kernel alone (heuristic and fixed pages per program) against
    scoring + each selection (Triton radix, CUDA radix), on the scored regime's shapes (one
    workload per (batch, pages) band)."""
    from kdispatch.kernels.cuda.dsa import indexer_select as C
    from kdispatch.kernels.triton.dsa import indexer_fp8 as X

    full = "dsa_topk_indexer"
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    picked = {}
    for w in load_workloads(ROOT / "traces", full):
        a = w.axes
        if a["max_num_pages"] * 64 > 2048:
            picked.setdefault((a["batch_size"] // 8, a["max_num_pages"] // 40), w)
    for _, w in sorted(picked.items()):
        args = list(materialize(full, w, device="cuda", seed=0))
        sets = timing.input_sets(full, args, l2, max_sets=4 if quick else timing.MAX_SETS)
        floor = floor_us("dsa_topk_indexer", args, dict(w.axes))
        # scores of short rows stay unwritten by design: return nothing for the replay check to inspect
        fns = {"score": lambda *a: [X.score_pages(*a, skip_short=True), None][1]}
        for pages in (1, 2):
            fns[f"score/{pages}p"] = lambda *a, pages=pages: [X.score_pages(*a, skip_short=True, pages=pages), None][1]
        for nw in (8, 16):
            fns[f"radix/{nw}w"] = lambda *a, nw=nw: X.indexer_radix(*a, select_warps=nw)
        fns["cuda_select"] = C.dsa_indexer_cuda_radix_select
        us = {k: statistics.median(timing.graph_times_us(f, sets, 5 if quick else None)[0]) for k, f in fns.items()}
        print(f"indexer {dict(w.axes)} floor={floor:.2f}us " + " ".join(f"{k}={v:.2f}" for k, v in us.items()),
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--definition", default="all", choices=["all", *OPS])
    ap.add_argument("--limit", type=int, default=None, help="first N workloads per definition")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and input sets")
    ap.add_argument("--official-dir", type=Path, default=None,
                    help="FlashInfer-Bench definitions folder (default: ../shared/fib/definitions)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sweep", nargs="?", const="all", choices=["all", "indexer", "attention", "cuda"],
                    help="indexer time breakdown, Triton split-K attention launch configurations, CUDA "
                         "split-K ones (not in 'all')")
    opts = ap.parse_args()
    if opts.sweep:
        if opts.sweep in ("all", "indexer"):
            indexer_breakdown(opts.quick)
        if opts.sweep in ("all", "attention"):
            sweep_splitk(opts.quick)
        if opts.sweep == "cuda":
            sweep_cuda_splitk(opts.quick)
        return
    ops = list(OPS) if opts.definition == "all" else [opts.definition]
    registry.discover()
    dev = torch.cuda.get_device_name()
    result = {"device": dev, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "triton": __import__("triton").__version__, "peak_bandwidth": peak_bandwidth(), "ops": {}}
    summary = []
    for op in ops:
        rows = bench_op(op, opts.limit, opts.quick, opts.official_dir)
        result["ops"][op] = rows
        summary += summarize(op, rows)
    out = opts.out or ROOT / "benchmarks" / "results" / f"dsa-{dev.replace(' ', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() and len(ops) < len(OPS):  # one definition re-measured: keep the other's rows
        old = json.loads(out.read_text())
        kept = {k: v for k, v in old.get("ops", {}).items() if k not in result["ops"]} if old.get("device") == dev else {}
        if kept:
            result["ops"].update(kept)
            result["note"] = (f"{', '.join(ops)} measured {result['date']}, {', '.join(kept)} kept from the file "
                              f"dated {old.get('date')}; each op's candidates were measured side by side in one run")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{dev}, {result['date']}, written {out}")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
