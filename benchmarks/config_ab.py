"""Two registered variants (or two configurations of one) side by side, in one process: CUDA-graph time
(input sets rotated past the L2, as the tuner times), eager time (host + device of single synchronised
calls) and host time until the call returns, measured in alternating rounds (A first in odd rounds, B
first in even ones; each column the median over rounds), with the outputs of both compared and each
checked finite, and the floor (benchmarks/floors.py). For a change measured as a new configuration
beside the one it may replace, before a re-tune.

    python benchmarks/config_ab.py moe_fp8 triton_decode.n128s4q:triton_decode.n128s4qf [...] \\
        --axes seq_len=1,2,8,32 [--rounds 3]
"""
from __future__ import annotations

import argparse
import time

import torch

from kdispatch import registry
from kdispatch.tuner import timing
from kdispatch.workloads import SimpleWorkload, materialize

from floors import floor_us  # noqa: E402  (benchmarks/ is the script folder)
from moe_host_ab import side_by_side  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("definition")
    ap.add_argument("pairs", nargs="+", help="A:B, two variant names")
    ap.add_argument("--axes", required=True, help="one axis and its values: name=v1,v2,...")
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()
    axis, values = opts.axes.split("=")
    registry.discover()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    print(f"# benchmarks/config_ab.py on {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}: A -> B, us per call, "
          f"medians of {opts.rounds} alternating rounds")
    for value in (int(v) for v in values.split(",")):
        axes = {axis: value}
        args = list(materialize(opts.definition, SimpleWorkload(axes, uuid=f"ab-{value}"), device="cuda", seed=0))
        sets = timing.input_sets(opts.definition, args, l2, max_sets=16)
        floor = floor_us(opts.definition, args, axes)
        for pair in opts.pairs:
            names = pair.split(":")
            fns = {name: registry.get(opts.definition, name).fn for name in names}
            outs = [fns[name](*args).float() for name in names]
            diff, scale = (outs[0] - outs[1]).abs().max().item(), outs[0].abs().max().item()
            finite = all(bool(torch.isfinite(o).all()) for o in outs)
            cols = side_by_side(fns[names[0]], fns[names[1]], sets, opts.rounds)
            print(f"{axis}={value:5d} {pair:44s} {cols} floor {floor:6.1f} max|A-B| {diff:.3g} of {scale:.3g}, "
                  f"finite {finite}", flush=True)


if __name__ == "__main__":
    main()
