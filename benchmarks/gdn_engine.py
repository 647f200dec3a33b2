"""GDN prefill and speculative verification in the engines' convention (gdn_prefill_pool_*,
gdn_prefill_gathered_* (vLLM's prefill call), gdn_verify_* (SGLang's), gdn_verify_steps_* (vLLM's); one
definition per TP degree): the routed op and every variant against the definition's baseline
(SGLang's FlashInfer prefill between its state gather and scatter; FlashInfer as vLLM calls it;
SGLang's Triton verify kernel; for vLLM's verification, the reference until vLLM's kernel is
staged), side by side in one run.

Per TP head count and shape: the correctness gate (kdispatch.tuner.gate, against the reference)
and CUDA-graph and eager time per call (kdispatch.tuner.timing: the state pool rotated past the L2),
with the HBM floor beside it. Prints a table, then per head count the routed op's speedup over the
baseline (mean, min; prefill also where sequences average <= 256 tokens), graph and eager. Writes JSON.

    python benchmarks/gdn_engine.py prefill|gathered|verify|verify_steps [--json out.json] [--heads 32 16 8 4]
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
from kdispatch.definitions.gdn.gathered import gathered_prefill_name
from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name, verify_name, verify_steps_name
from kdispatch.workloads import materialize

from floors import floor_us  # noqa: E402  (benchmarks/ is the script folder)
from side_by_side import gated_times  # noqa: E402

# (sequences, tokens in all): few to many sequences, 16 to 4096 tokens each on average
PREFILL = [(n, n * m) for n in (1, 4, 16, 64) for m in (16, 64, 256, 1024, 4096) if n * m <= 32768]
VERIFY = [(n, s) for n in (1, 4, 16, 64, 256) for s in (2, 4, 8)]  # (requests, draft tokens each)


def shapes(family: str) -> list[dict]:
    if family == "prefill":
        return [{"total_seq_len": t, "num_seqs": n, "num_slots": n + 1} for n, t in PREFILL]
    if family == "gathered":
        return [{"total_seq_len": t, "num_seqs": n} for n, t in PREFILL]
    if family == "verify_steps":
        return [{"num_seqs": n, "num_steps": s, "total_seq_len": n * s, "num_slots": n * s + 1} for n, s in VERIFY]
    return [{"num_seqs": n, "cache_steps": s, "total_seq_len": n * s, "num_slots": n + 1, "num_cache_rows": n}
            for n, s in VERIFY]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", choices=("prefill", "gathered", "verify", "verify_steps"))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--heads", type=int, nargs="+", default=[hv for _, hv in PACKED_HEADS.values()])
    opts = ap.parse_args()
    name_of = {"prefill": pool_prefill_name, "gathered": gathered_prefill_name, "verify": verify_name,
               "verify_steps": verify_steps_name}[opts.family]
    op = {"prefill": kdispatch.ops.gdn_prefill_pool, "gathered": kdispatch.ops.gdn_prefill_gathered,
          "verify": kdispatch.ops.gdn_verify, "verify_steps": kdispatch.ops.gdn_verify_steps}[opts.family]
    here = kdispatch.arch.local_arch()
    rows = []
    for hq, hv in PACKED_HEADS.values():
        if hv not in opts.heads:
            continue
        name = name_of(hq, hv)
        base = registry.baseline(name, here)
        variants = [v for v in registry.variants(name) if v.name != registry.REFERENCE and v.why_not(here) is None]
        for axes in shapes(opts.family):
            cands = {"routed": op, **{v.name: v.fn for v in variants if v.declines(axes) is None}}
            w = {"uuid": f"gdn-engine-bench-{opts.family}-{hv}-{'-'.join(map(str, axes.values()))}", "axes": axes,
                 "inputs": {}}
            args = list(materialize(name, w, device="cuda"))
            row = {"definition": name, **axes, "floor_us": floor_us(name, args, axes), "baseline": base.name,
                   **gated_times(name, cands, args)}
            rows.append(row)
            best = min((v["graph_us"], k) for k, v in row.items() if isinstance(v, dict) and "graph_us" in v)
            cells = "  ".join(f"{k} {row[k]['graph_us']:7.1f}/{row[k]['eager_us']:7.1f}" if "graph_us" in row[k]
                              else f"{k} {row[k]['status']}" for k in ("routed", base.name) if k in row)
            print(f"{name} {axes} floor {row['floor_us']:7.1f}  {cells}  best {best[1]} {best[0]:.1f}", flush=True)
    summary = {}
    for hq, hv in PACKED_HEADS.values():
        name = name_of(hq, hv)
        mine = [r for r in rows if r["definition"] == name and "graph_us" in r["routed"]
                and "graph_us" in r.get(r["baseline"], {})]
        if not mine:
            continue
        s = {}
        for mode in ("graph_us", "eager_us"):
            ratios = [r[r["baseline"]][mode] / r["routed"][mode] for r in mine]
            s[mode.split("_")[0]] = {"mean_speedup": statistics.fmean(ratios), "min_speedup": min(ratios)}
            if opts.family in ("prefill", "gathered"):
                short = [r[r["baseline"]][mode] / r["routed"][mode] for r in mine
                         if r["total_seq_len"] <= 256 * r["num_seqs"]]
                s[mode.split("_")[0]]["min_speedup_mean_len_le_256"] = min(short) if short else None
        summary[name] = s
        print(f"{name}: routed over the baseline, graph mean {s['graph']['mean_speedup']:.2f}x min "
              f"{s['graph']['min_speedup']:.2f}x; eager mean {s['eager']['mean_speedup']:.2f}x min "
              f"{s['eager']['min_speedup']:.2f}x")
    if opts.json:
        opts.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "date": datetime.date.today().isoformat(), "family": opts.family,
                                         "rows": rows, "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
