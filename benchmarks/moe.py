"""FP8 block-scale MoE on the contest workloads: the baseline of this architecture (on sm_90
SGLang's Triton fused MoE where it is staged), the project's reference, every kdispatch variant
that runs here (DeepGEMM's grouped GEMMs among them where DeepGEMM is built) and the routed op, side
by side in one run, each checked by the tuner's gate first. CUDA-graph time per call (routing logits
rotated so that different experts' weights are read; the reference and the variants that read a
count back from the device cannot be captured, so they are timed with events around eager calls) and eager time (host + device of a synchronised call): the
host time a call adds, eager - graph, is what the MoE issue bounds at 30 us.

The floor is the FP8 weight bytes of the experts the batch touches (each read once) at peak HBM
bandwidth, and the FP8 tensor-core time of the two GEMMs at the dense peak (989 TFLOP/s on H100
SXM); the larger of the two is reported, and every result as a percentage of it.
Writes benchmarks/results/moe-<device>.json; prints a table and a summary last.

    python benchmarks/moe.py [--limit N] [--quick] [--variants NAME ...]
    python benchmarks/moe.py --sweep     # tile configurations of the grouped Triton kernels
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

import torch

import kdispatch
from kdispatch import registry
from kdispatch.tuner import gate, timing
from kdispatch.workloads import load_workloads, materialize

from floors import floor_us  # noqa: E402  (benchmarks/ is the script folder)

ROOT = Path(__file__).resolve().parents[1]
DEF = "moe_fp8"


def sweep(quick: bool) -> None:
    """Graph time of tile configurations of kernels/triton/moe/fp8_grouped.py on a spread of batch sizes."""
    from kdispatch.kernels.triton.moe import fp8_grouped as G

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    by_len = {w.axes["seq_len"]: w for w in load_workloads(ROOT / "traces", DEF)}
    for seq_len in (1, 16, 80, 901, 14107):
        small = seq_len <= 80
        configs = [dict(block_m=bm, block_n1=bn, block_n2=bn, num_warps=nw, num_stages=st)
                   for bm in ((16, 32) if small else (32, 64, 128)) for bn in ((16, 32, 64) if small else (64, 128))
                   for nw in (4, 8) for st in ((4,) if small else (3,)) if not (bm == 128 and bn == 128 and nw == 4)]
        args = list(materialize(DEF, by_len[seq_len], device="cuda", seed=0))
        sets = timing.input_sets(DEF, args, l2, max_sets=2 if quick else 8)

        def fused_layout_only(*a):  # routing + expert-sorted layout, no GEMM
            return G._fused_route_layout(a[0], a[1], a[8], a[9], 32, 16)[1]

        res = [(statistics.median(timing.graph_times_us(fused_layout_only, sets, 3)[0]), "routing + layout only")]
        for c in configs:
            fn = lambda *a, c=c: G.moe_fp8_grouped(*a, **c)  # noqa: E731
            try:
                res.append((statistics.median(timing.graph_times_us(fn, sets, 3)[0]), c))
            except Exception as exc:
                print(f"seq_len={seq_len} {c}: {type(exc).__name__}: {str(exc)[:80]}")
        res.sort(key=lambda r: r[0])
        name = lambda c: c if isinstance(c, str) else "/".join(str(c[k]) for k in  # noqa: E731
                                                               ("block_m", "block_n1", "num_warps", "num_stages"))
        print(f"seq_len={seq_len} floor={floor_us(DEF, args, {'seq_len': seq_len}):.0f}us " + ", ".join(
            f"{name(c)}={us:.0f}" for us, c in res[:8] + [r for r in res[8:] if isinstance(r[1], str)]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variants", nargs="*", default=None, help="only these variants (the reference and the baseline always)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sweep", action="store_true", help="sweep the Triton kernels' tile configurations")
    opts = ap.parse_args()
    if opts.sweep:
        return sweep(opts.quick)
    registry.discover()
    here = kdispatch.arch.local_arch()
    baseline = registry.baseline(DEF, here).name
    cands = {v.name: v.fn for v in registry.variants(DEF) if v.why_not(here) is None
             and (v.name in ("reference", baseline) or opts.variants is None or v.name in opts.variants)}
    registry_names = set(cands)
    cands["routed"] = kdispatch.ops.moe_fp8
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    dev = torch.cuda.get_device_name()
    reps = 3 if opts.quick else 5
    rows = []
    for w in sorted(load_workloads(ROOT / "traces", DEF), key=lambda w: w.axes["seq_len"])[:opts.limit]:
        args = list(materialize(DEF, w, device="cuda", seed=0))
        want = gate.reference(DEF, args)
        sets = timing.input_sets(DEF, args, l2, max_sets=2 if opts.quick else 8)
        row = {"uuid": w.uuid, "seq_len": w.axes["seq_len"], "floor_us": floor_us(DEF, args, dict(w.axes)), "results": {}}
        routed_to = kdispatch.ops.DISPATCHERS["moe_fp8"].choose(here, dict(w.axes)).name
        for name, fn in cands.items():
            declined = name in registry_names and registry.get(DEF, name).declines(dict(w.axes))
            if declined:  # e.g. the decode kernels beyond their batch limit
                continue
            r = {}
            try:
                v = gate.run_gate(DEF, fn, [(args, want)])
                r["correct"], r["error"] = v.passed, "" if v.passed else f"{v.status}: {v.reason}"[:300]
                r["matched_ratio"] = v.metrics.get("output.matched_ratio")
                if v.passed:
                    # The reference syncs with the host (no graph capture): events, also when routed to it.
                    if name == "reference" or (name == "routed" and routed_to == "reference"):
                        r["event_us"] = statistics.median(timing.event_times_us(fn, sets, reps))
                    else:
                        try:
                            r["graph_us"] = statistics.median(
                                timing.graph_times_us(fn, sets, 3 if opts.quick else None)[0])
                        except Exception as exc:  # eager only (the DeepGEMM variants read their row count back)
                            r["graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
                            r["event_us"] = statistics.median(timing.event_times_us(fn, sets, reps))
                    r["eager_us"] = statistics.median(timing.eager_times_us(fn, sets, max(reps, len(sets))))
            except Exception as exc:
                r["correct"], r["error"] = False, f"{type(exc).__name__}: {exc}"[:300]
            row["results"][name] = r
        ref_us = row["results"]["reference"].get("event_us")
        base_us = row["results"][baseline].get("graph_us", row["results"][baseline].get("event_us"))
        for r in row["results"].values():
            device_us = r.get("graph_us") or r.get("event_us")  # events where a variant cannot be captured
            if device_us:
                r["speedup_vs_baseline"] = base_us / device_us if base_us else None
                r["speedup_vs_reference"] = ref_us / device_us if ref_us else None
                r["pct_of_floor"] = 100 * row["floor_us"] / device_us
            if r.get("graph_us") and r.get("eager_us"):
                r["host_us"] = r["eager_us"] - r["graph_us"]
        rows.append(row)
        cells = "  ".join(f"{k}={v.get('graph_us', v.get('event_us', float('nan'))):.0f}" if v["correct"]
                          else f"{k}=FAIL({v['error'][:60]})" for k, v in row["results"].items())
        print(f"seq_len={row['seq_len']:>6} floor={row['floor_us']:.0f}us  {cells}", flush=True)
    out = opts.out or ROOT / "benchmarks" / "results" / f"moe-{dev.replace(' ', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": dev, "date": datetime.date.today().isoformat(), "baseline": baseline,
                               "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    print(f"\n{dev}, {datetime.date.today()}, baseline {baseline}, written {out}")
    print(f"{'candidate':<26}{'ok':>6}{'mean x base':>13}{'min x base':>12}{'mean x ref':>12}{'mean %floor':>13}"
          f"{'max eager-graph us':>20}")
    for name in cands:
        rs = [r["results"][name] for r in rows if name in r["results"]]
        col = lambda key: [r[key] for r in rs if r.get(key) is not None]  # noqa: E731
        f = lambda xs, fn=statistics.mean: f"{fn(xs):.2f}" if xs else "n/a"  # noqa: E731
        print(f"{name:<26}{sum(r['correct'] for r in rs):>3}/{len(rs):<2}{f(col('speedup_vs_baseline')):>13}"
              f"{f(col('speedup_vs_baseline'), min):>12}{f(col('speedup_vs_reference')):>12}"
              f"{f(col('pct_of_floor')):>13}{f(col('host_us'), max):>20}")

if __name__ == "__main__":
    main()
