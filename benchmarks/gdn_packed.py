"""GDN decode in the engines' convention (gdn_decode_packed_*, one definition per TP degree):
the routed op against SGLang's own packed decode kernel (what SGLang runs on Hopper; vLLM's default
has the same contract), side by side in one run.

Per TP head count and batch size: the correctness gate (kdispatch.tuner.gate, against the
reference) and CUDA-graph and eager time per call (kdispatch.tuner.timing: the state pool rotated
past the L2) of
    sglang       SGLang's kernel called bare, as its GDN backend calls it (needs
                 benchmarks/stage_engines.sh's staging; no slot guard)
    routed       kdispatch.ops.gdn_decode_packed (the committed router, slot guard included)
    <config>     every configuration of cuda_decode_pool_rows and triton_decode_pool
with the HBM floor (live slots' states read and written once, packed rows read) beside it.
Writes JSON; prints a table, then the speedup of the routed op over SGLang per head count (mean over
batches 1-256 and min), graph and eager.

    python benchmarks/gdn_packed.py [--json out.json] [--batches 1 2 4 ...]
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
from kdispatch.definitions.gdn.names import PACKED_HEADS, packed_name
from kdispatch.workloads import materialize

from floors import floor_us  # noqa: E402  (benchmarks/ is the script folder)
from side_by_side import gated_times  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def sglang_bare():
    try:
        from kdispatch.kernels.library.gdn import sglang
        kernel = sglang.packed_decode_kernel()
    except Exception as exc:  # not staged here
        print(f"SGLang's kernel unavailable: {type(exc).__name__}: {exc}")
        return None

    def run(mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out, scale):
        kernel(mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale, initial_state=state_pool,
               out=out, ssm_state_indices=state_indices, use_qk_l2norm_in_kernel=True)
        return out, state_pool

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    opts = ap.parse_args()
    bare = sglang_bare()
    rows = []
    for hq, hv in PACKED_HEADS.values():
        name = packed_name(hq, hv)
        cands = {"routed": kdispatch.ops.gdn_decode_packed}
        if bare is not None:
            cands["sglang"] = bare
        for v in registry.variants(name):
            if v.name.startswith(("cuda_decode_pool_rows", "triton_decode_pool")) and v.why_not(kdispatch.arch.local_arch()) is None:
                cands[v.name.split(".", 1)[1]] = v.fn
        for batch in opts.batches:
            w = {"uuid": f"gdn-packed-bench-{hv}-{batch}", "axes": {"batch_size": batch, "num_slots": batch + 1},
                 "inputs": {}}
            args = list(materialize(name, w, device="cuda"))
            row = {"definition": name, "batch_size": batch, "floor_us": floor_us(name, args, w["axes"]),
                   **gated_times(name, cands, args)}
            rows.append(row)
            cells = "  ".join(f"{k} {v['graph_us']:6.1f}/{v['eager_us']:6.1f}" if "graph_us" in v else f"{k} FAIL"
                              for k, v in row.items() if isinstance(v, dict))
            print(f"qk{hq}_v{hv} B={batch:4d} floor {row['floor_us']:6.1f}  {cells}", flush=True)
    summary = {}
    for hq, hv in PACKED_HEADS.values():
        mine = [r for r in rows if r["definition"] == packed_name(hq, hv) and r["batch_size"] <= 256
                and "graph_us" in r.get("sglang", {}) and "graph_us" in r["routed"]]
        if not mine:
            continue
        s = {}
        for mode in ("graph_us", "eager_us"):
            ratios = [r["sglang"][mode] / r["routed"][mode] for r in mine]
            s[mode.split("_")[0]] = {"mean_speedup": statistics.fmean(ratios), "min_speedup": min(ratios)}
        summary[f"qk{hq}_v{hv}"] = s
        print(f"qk{hq}_v{hv}: routed over SGLang, graph mean {s['graph']['mean_speedup']:.2f}x min "
              f"{s['graph']['min_speedup']:.2f}x; eager mean {s['eager']['mean_speedup']:.2f}x min "
              f"{s['eager']['min_speedup']:.2f}x")
    if opts.json:
        opts.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "date": datetime.date.today().isoformat(), "rows": rows,
                                         "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
