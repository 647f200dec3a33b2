"""The MoE Triton kernels of an earlier revision beside the working tree's, in one run: CUDA-graph time
(input sets rotated past the L2, as the tuner times), eager time (host + device of single
synchronised calls) and host time until the call returns, per token count and configuration; the
outputs of both compared. For a change that should cut host time without costing device time.

The earlier modules are read from a folder (the GPU machine has no git): on the dev box,
`bash benchmarks/moe_ab_old.sh REV` writes it (moe-old/, registrations cut and launch keys renamed;
`deepgemm_fused_bound` is timed where DeepGEMM imports: after its bundle's setup), then on the GPU machine

    python benchmarks/moe_host_ab.py --old moe-old [--seq-lens 1 8 32 128 512 2048] [--rounds 3]

With --rounds N the two revisions are timed N times in alternation (old first in odd rounds, new first in
even ones) and each column is the median over rounds, with the graph times' spread over rounds printed:
at 8-16k tokens one round's graph time moves by several percent, more than the change being measured.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

from kdispatch import registry
from kdispatch.tuner import timing
from kdispatch.workloads import SimpleWorkload, materialize

DEF = "moe_fp8"
GROUPED = ["triton_grouped_m16.fr", "triton_grouped_m32q.fr", "triton_grouped_m64q.fr"]
DECODE = ["n128s8q", "n128s4q", "n64s4qc"]


def host_us(fn, sets, calls: int = 40) -> float:
    """Median host microseconds until `fn` returns, after a sync."""
    samples = []
    for i in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*sets[i % len(sets)])
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def side_by_side(a, b, sets, rounds: int) -> str:
    """`a` and `b` timed in `rounds` alternating rounds (a first in odd rounds, b in even ones): each
    one's median over rounds of its graph time (inputs rotated), eager time, their difference and host
    time until return, as "what A -> B" columns, and with several rounds the graph times' spread."""
    rows = ([], [])
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            fn = (a, b)[i]
            graph = statistics.median(timing.graph_times_us(fn, sets, 5)[0])
            eager = statistics.median(timing.eager_times_us(fn, sets, 40))
            rows[i].append((graph, eager, eager - graph, host_us(fn, sets)))
    t = [[statistics.median(col) for col in zip(*one)] for one in rows]
    text = " ".join(f"{what} {t[0][i]:7.1f} -> {t[1][i]:7.1f} "
                    for i, what in enumerate(("graph", "eager", "eager-graph", "host")))
    if rounds > 1:
        text += " graph spread " + " / ".join(
            f"{100 * (max(g) - min(g)) / min(g):.1f}%" for g in ([row[0] for row in one] for one in rows))
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True,
                    help="folder holding old_grouped.py and old_decode.py (and old_deepgemm_fused.py)")
    ap.add_argument("--only", nargs="+", help="these cases only (names as printed)")
    ap.add_argument("--decode", nargs="+", default=DECODE,
                    help="decode configurations; OLD:NEW times the earlier revision's OLD against this one's NEW")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1, 8, 32, 128, 512, 2048])
    ap.add_argument("--rounds", type=int, default=1, help="alternating timing rounds per case")
    opts = ap.parse_args()
    sys.path.insert(0, opts.old)
    old_grouped, old_decode = importlib.import_module("old_grouped"), importlib.import_module("old_decode")
    from kdispatch.kernels.triton.moe import fp8_decode, fp8_grouped
    deepgemm = []
    if importlib.util.find_spec("deep_gemm") and (Path(opts.old) / "old_deepgemm_fused.py").is_file():
        from kdispatch.kernels.library.moe import deepgemm_fused
        deepgemm = [("deepgemm_fused_bound", importlib.import_module("old_deepgemm_fused").moe_fp8_deepgemm_fused,
                     deepgemm_fused.moe_fp8_deepgemm_fused, dict(bound=True), dict(bound=True))]

    registry.discover()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"# benchmarks/moe_host_ab.py on {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: old -> new, us per call")
    for seq_len in opts.seq_lens:
        args = list(materialize(DEF, SimpleWorkload({"seq_len": seq_len}, uuid=f"ab-{seq_len}"), device="cuda",
                                seed=0))
        sets = timing.input_sets(DEF, args, l2, max_sets=16)
        # (name, old function, new function, old configuration, new configuration)
        cases = [(name, old_grouped.moe_fp8_grouped, fp8_grouped.moe_fp8_grouped, fp8_grouped.CONFIGS[name],
                  fp8_grouped.CONFIGS[name])
                 for name in GROUPED] + deepgemm
        if seq_len <= fp8_decode.MAX_TOKENS:
            for labels in opts.decode:
                old_label, _, new_label = labels.partition(":")
                cases.append((f"triton_decode.{labels}", old_decode.moe_fp8_decode, fp8_decode.moe_fp8_decode,
                              old_decode.CONFIGS[old_label], fp8_decode.CONFIGS[new_label or old_label]))
        for name, old_fn, new_fn, old_config, new_config in cases:
            if opts.only and name not in opts.only:
                continue
            pair = {"old": lambda *a, f=old_fn, c=old_config: f(*a, **c),
                    "new": lambda *a, f=new_fn, c=new_config: f(*a, **c)}
            old_out, new_out = pair["old"](*args).float(), pair["new"](*args).float()
            diff, scale = (old_out - new_out).abs().max().item(), old_out.abs().max().item()
            finite = bool(torch.isfinite(new_out).all())
            cols = side_by_side(pair["old"], pair["new"], sets, opts.rounds)
            print(f"T={seq_len:5d} {name:24s} {cols} max|old-new| {diff:.3g} of {scale:.3g}, finite {finite}",
                  flush=True)


if __name__ == "__main__":
    main()
