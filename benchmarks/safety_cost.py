"""What input safety costs on the GPU, side by side in one run.

1. The checked mode (KDISPATCH_CHECK=1, off by default): eager host + device time per call of
   `kdispatch.ops.<op>` with the checks off and on, on the smallest, a middle and the largest contest
   workload of each definition (by its first variable axis).
2. The prefill guard (kernels/cuda/gdn/prefill_guard.py): each library prefill variant (guard launch,
   library kernel, and for fla the commit launch) against the library kernel called bare, as an engine calls it
   (FlashInfer with gates activated beforehand, outside the timing; fla-core with the gates in its
   kernel; both leaving the final state in a new buffer), in CUDA graphs and eagerly.

Inputs rotate through enough sets to exceed the L2 (kdispatch.tuner.timing). Writes
benchmarks/results/safety-cost-<device>.json; prints a table last.

    python benchmarks/safety_cost.py [--quick]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
from pathlib import Path

import torch

import kdispatch
from kdispatch import definitions, registry
from kdispatch.dispatch import CHECK_VAR
from kdispatch.tuner import timing
from kdispatch.workloads import load_workloads, materialize

from gdn import fla_call  # noqa: E402  (benchmarks/ is the script folder)

ROOT = Path(__file__).resolve().parents[1]
OPS = ("moe_fp8", "dsa_topk_indexer", "dsa_sparse_attention", "gdn_decode", "gdn_prefill")


def spread(short: str, n: int) -> list:
    """n workloads of a definition from smallest to largest along its first variable axis."""
    ws = load_workloads(ROOT / "traces", definitions.get(short).name)
    axis = definitions.get(short).var_axes[0]
    ws = sorted(ws, key=lambda w: w.axes[axis])
    return [ws[round(i * (len(ws) - 1) / max(n - 1, 1))] for i in range(n)]


def set_checked(op: str, on: bool) -> None:
    if on:
        os.environ[CHECK_VAR] = "1"
    else:
        os.environ.pop(CHECK_VAR, None)
    kdispatch.ops.DISPATCHERS[op].reload_switches()


def checked_mode(quick: bool, l2: int) -> list[dict]:
    rows = []
    for op in OPS:
        fn = getattr(kdispatch.ops, op)
        for w in spread(op, 2 if quick else 3):
            args = list(materialize(op, w, device="cuda", seed=0))
            sets = timing.input_sets(op, args, l2, max_sets=8 if quick else 32)
            us = {}
            for on in (False, True, False, True):  # interleaved: drift shows up in both
                set_checked(op, on)
                fn(*sets[0])  # first call: validation and routing
                us.setdefault(on, []).append(statistics.median(timing.eager_times_us(fn, sets, 20 if quick else 100)))
            set_checked(op, False)
            row = {"op": op, "axes": dict(w.axes), "off_us": min(us[False]), "on_us": min(us[True])}
            rows.append(row)
            print(f"checked {op} {row['axes']}: off {row['off_us']:.1f} us, on {row['on_us']:.1f} us", flush=True)
    return rows


def flashinfer_bare():
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    def run(q, k, v, state, alpha, beta, cu_seqlens, scale):
        out = chunk_gated_delta_rule(q, k, v, g=alpha, beta=beta, scale=scale, initial_state=state,
                                     output_final_state=True, cu_seqlens=cu_seqlens,
                                     output_state=torch.empty_like(state))
        return out[0] if isinstance(out, tuple) else out
    return run


def activated(sets: list) -> list:
    """FlashInfer's bare inputs: the gates activated once, ahead of the timing."""
    out = []
    for q, k, v, state, A_log, a, dt_bias, b, cu, scale in sets:
        alpha = torch.exp(-torch.exp(A_log.float()) * torch.nn.functional.softplus(a.float() + dt_bias.float()))
        out.append([q, k, v, state, alpha, torch.sigmoid(b.float()), cu, scale])
    return out


def prefill_guard(quick: bool, l2: int) -> list[dict]:
    here = kdispatch.arch.local_arch()
    pairs = {}  # library variant -> (its kdispatch variant, the bare call, bare-input maker)
    for name, bare, prep in (("flashinfer", flashinfer_bare, activated),
                             ("fla_chunk", lambda: fla_call("gdn_prefill"), None)):
        v = registry.get("gdn_prefill", name)
        if v.why_not(here) is None:
            pairs[name] = (v.fn, bare(), prep)
    rows = []
    for w in spread("gdn_prefill", 3 if quick else 6):
        args = list(materialize("gdn_prefill", w, device="cuda", seed=0))
        sets = timing.input_sets("gdn_prefill", args, l2, max_sets=8 if quick else 32)
        for name, (wrapped, bare, prep) in pairs.items():
            bare_sets = prep(sets) if prep else sets
            row = {"variant": name, "axes": dict(w.axes)}
            for label, fn, s in (("bare", bare, bare_sets), ("kdispatch", wrapped, sets)):
                try:
                    row[f"{label}_graph_us"] = statistics.median(timing.graph_times_us(fn, s, 5 if quick else 20)[0])
                except Exception as exc:  # e.g. a library call that syncs cannot be captured
                    row[f"{label}_graph_us"] = float("nan")
                    row[f"{label}_graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
                    torch.cuda.synchronize()
                row[f"{label}_eager_us"] = statistics.median(timing.eager_times_us(fn, s, 20 if quick else 100))
            rows.append(row)
            print(f"guard {name} {row['axes']}: graph {row['bare_graph_us']:.1f} -> {row['kdispatch_graph_us']:.1f} us, "
                  f"eager {row['bare_eager_us']:.1f} -> {row['kdispatch_eager_us']:.1f} us "
                  + " ".join(v for k, v in row.items() if k.endswith("_error")), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()
    registry.discover()
    device = torch.cuda.get_device_name()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    checked = checked_mode(opts.quick, l2)
    guard = prefill_guard(opts.quick, l2)
    out = opts.json or ROOT / "benchmarks" / "results" / f"safety-cost-{device.replace(' ', '_')}.json"
    out.write_text(json.dumps({"device": device, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
                               "checked_mode": checked, "prefill_guard": guard}, indent=1) + "\n")
    print(f"\n{device}, {datetime.date.today()}: eager us per call, KDISPATCH_CHECK off -> on")
    for r in checked:
        print(f"  {r['op']:<22}{str(r['axes']):<58}{r['off_us']:>9.1f}{r['on_us']:>9.1f}  +{r['on_us'] - r['off_us']:.1f}")
    print("prefill guard: bare library call -> kdispatch variant (graph us, eager us)")
    for r in guard:
        print(f"  {r['variant']:<12}{str(r['axes']):<58}{r['bare_graph_us']:>8.1f} -> {r['kdispatch_graph_us']:<8.1f}"
              f"{r['bare_eager_us']:>8.1f} -> {r['kdispatch_eager_us']:.1f}")


if __name__ == "__main__":
    main()
