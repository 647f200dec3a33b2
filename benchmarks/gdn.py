"""GDN decode and prefill on the contest workloads: FlashInfer (baseline), fla-core, every kdispatch
variant that runs here, and the routed op, side by side in one run.

Per workload and candidate: correctness through the tuner's gate (kdispatch.tuner.gate: output and
new state against the project's reference, NaN/Inf fail), CUDA-graph time per call
(kdispatch.tuner.timing) with the state rotated through enough buffers to exceed 4x the L2 (as in serving, where other layers evict a layer's state), eager
host + device time per call, and the HBM floor (bytes that must move / peak bandwidth).
Writes benchmarks/results/gdn-<device>.json; prints a per-workload table and a summary last.

    python benchmarks/gdn.py [--definition gdn_decode|gdn_prefill|all] [--limit N] [--quick]
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

from floors import floor_us, peak_bandwidth  # noqa: E402  (benchmarks/ is the script folder)

ROOT = Path(__file__).resolve().parents[1]
OPS = ("gdn_decode", "gdn_prefill")


def fla_call(op: str):
    """fla-core as SGLang/vLLM call it on Hopper (returns a new final state; as the anchors time it)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except ImportError:
        return None
    flags = dict(output_final_state=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                 state_v_first=True)
    if op == "gdn_decode":
        def run(q, k, v, state, A_log, a, dt_bias, b, scale):
            return fused_recurrent_gated_delta_rule(q, k, v, g=a, beta=b, scale=scale, initial_state=state,
                                                    A_log=A_log, dt_bias=dt_bias, **flags)
    else:
        def run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
            o, s = chunk_gated_delta_rule(q[None], k[None], v[None], g=a[None], beta=b[None], scale=scale,
                                          initial_state=state, A_log=A_log, dt_bias=dt_bias,
                                          cu_seqlens=cu_seqlens, **flags)
            return o[0], s
    return run


def candidates(op: str) -> dict:
    full = op
    here = kdispatch.arch.local_arch()
    out = {"flashinfer": registry.baseline(full, here).fn}
    fla = fla_call(op)
    if fla is not None:
        out["fla-core"] = fla
    for v in registry.variants(full):
        if v.name not in ("reference", "flashinfer") and v.why_not(here) is None:
            out[v.name] = v.fn
    out["routed"] = getattr(kdispatch.ops, op)
    return out


def check(op: str, name: str, fn, args, ref) -> tuple[bool, str]:
    """The tuner's correctness gate (kdispatch.tuner.gate) on one input set; fla-core returns a new
    state instead of updating `state` in place, so the in-place contract is not asked of it."""
    v = gate.run_gate(op, fn, [(args, ref)], check_in_place=name != "fla-core")
    m = v.metrics
    detail = f"out {m.get('output.rel_norm', float('nan')):.1e} state {m.get('new_state.rel_norm', float('nan')):.1e}"
    return v.passed, detail if v.passed else f"{v.status}: {v.reason} ({detail})"


def graph_time_us(fn, sets, reps: int) -> float:
    """Median per-call time of a CUDA graph that calls fn once per input set (kdispatch.tuner.timing:
    the captured work is checked, a replay must write the outputs)."""
    times, _ = timing.graph_times_us(fn, sets, reps)
    return statistics.median(times)


def eager_time_us(fn, sets, reps: int) -> float:
    return statistics.median(timing.eager_times_us(fn, sets, reps))


def bench_op(op: str, limit: int | None, quick: bool) -> list[dict]:
    full = op
    cands = candidates(op)
    workloads = load_workloads(ROOT / "traces", full)[:limit]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for w in workloads:
        axes = dict(w.axes)
        args = list(materialize(full, w, device="cuda", seed=0))
        ref_out = gate.reference(full, args)
        # The state rotated through enough copies to exceed 4x the L2 (kdispatch.tuner.timing).
        sets = timing.input_sets(full, args, l2, max_sets=16 if quick else timing.MAX_SETS)
        n_sets = len(sets)
        row = {"uuid": w.uuid, "axes": axes, "floor_us": floor_us(op, args, axes), "state_sets": n_sets,
               "results": {}}
        for name, fn in cands.items():
            r = {}
            try:
                r["correct"], r["error"] = check(op, name, fn, args, ref_out)
                if r["correct"]:
                    r["graph_us"] = graph_time_us(fn, sets, reps=5 if quick else 20)
                    r["eager_us"] = eager_time_us(fn, sets, reps=20 if quick else 100)
            except Exception as exc:  # a failing candidate is reported, the run goes on
                r["correct"], r["error"] = False, f"{type(exc).__name__}: {exc}"[:300]
            row["results"][name] = r
        base = row["results"]["flashinfer"].get("graph_us")
        for name, r in row["results"].items():
            if base and r.get("graph_us"):
                r["speedup_vs_flashinfer"] = base / r["graph_us"]
                r["pct_of_floor"] = 100 * row["floor_us"] / r["graph_us"]
        rows.append(row)
        cells = "  ".join(f"{k}={v.get('graph_us', float('nan')):.2f}" if v["correct"] else f"{k}=FAIL"
                          for k, v in row["results"].items())
        print(f"{op} {axes} floor={row['floor_us']:.2f}us  {cells}", flush=True)
    return rows


def summarize(op: str, rows: list[dict]) -> list[str]:
    lines = [f"\n== {op}: {len(rows)} workloads, graph time (state rotated), mean of per-workload speedups"]
    names = list(rows[0]["results"]) if rows else []
    lines.append(f"{'candidate':<28}{'ok':>6}{'mean x FI':>11}{'min x FI':>10}{'mean x fla':>12}{'mean %floor':>13}{'eager med us':>14}")
    for name in names:
        rs = [r["results"][name] for r in rows]
        ok = sum(r["correct"] for r in rs)
        sp = [r["speedup_vs_flashinfer"] for r in rs if "speedup_vs_flashinfer" in r]
        vs_fla = [row["results"]["fla-core"]["graph_us"] / row["results"][name]["graph_us"] for row in rows
                  if "fla-core" in row["results"] and row["results"]["fla-core"].get("graph_us")
                  and row["results"][name].get("graph_us")]
        fl = [r["pct_of_floor"] for r in rs if "pct_of_floor" in r]
        ea = [r["eager_us"] for r in rs if "eager_us" in r]
        f = lambda xs, fn=statistics.mean: f"{fn(xs):.2f}" if xs else "n/a"  # noqa: E731
        lines.append(f"{name:<28}{ok:>3}/{len(rs):<2}{f(sp):>11}{f(sp, min):>10}{f(vs_fla):>12}{f(fl):>13}{f(ea, statistics.median):>14}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--definition", default="all", choices=["all", *OPS])
    ap.add_argument("--limit", type=int, default=None, help="first N workloads per definition")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and state buffers")
    ap.add_argument("--out", type=Path, default=None)
    opts = ap.parse_args()
    ops = list(OPS) if opts.definition == "all" else [opts.definition]
    dev = torch.cuda.get_device_name()
    result = {"device": dev, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "peak_bandwidth": peak_bandwidth(), "ops": {}}
    for pkg in ("flashinfer", "fla", "triton"):
        try:
            result[pkg] = __import__(pkg).__version__
        except Exception:
            pass
    summary = []
    for op in ops:
        rows = bench_op(op, opts.limit, opts.quick)
        result["ops"][op] = rows
        summary += summarize(op, rows)
    out = opts.out or ROOT / "benchmarks" / "results" / f"gdn-{dev.replace(' ', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{dev}, {result['date']}, written {out}")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
