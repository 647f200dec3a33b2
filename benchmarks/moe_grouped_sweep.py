"""Launch configurations of the MoE grouped kernels (kernels/triton/moe/fp8_grouped.py) beyond the
registered ones, on the GPU machine, at prefill-size batches: as benchmarks/moe_decode_sweep.py does
for the decode kernels (its `sweep`): each configuration's CUDA-graph time against the floor and each
kernel's device time. Where every one of the 32 local experts is hit (from ~128 tokens) the floor is
their 1.41 GB of FP8 weights at peak HBM bandwidth, and a row block re-reads its expert's weights:
the tile height and the expert's rows decide how often. Needs only torch and Triton (no bundles).

    python benchmarks/moe_grouped_sweep.py [--seq-lens 512 901 2048 4096] [--minutes 5] [--shard I/N] [--json out.json]
"""
from __future__ import annotations

import datetime
import itertools
import time

import torch
import triton

from kdispatch import registry
from kdispatch.kernels.triton.moe import fp8_grouped

from moe_decode_sweep import options, sweep, write_json  # noqa: E402  (benchmarks/ is the script folder)


def configs():
    """The registered ones first, then a grid over tile heights, down-projection tile widths, warps
    and stages, all with the FP8 down projection (routed above 52 tokens)."""
    yield from fp8_grouped.CONFIGS.items()
    for m, n2, w, st in itertools.product((32, 64, 128), (64, 128), (4, 8), (3, 4, 5)):
        yield (f"m{m}n{n2}w{w}p{st}q",
               dict(block_m=m, block_n1=128, block_n2=n2, num_warps=w, num_stages=st, fp8_y=True))


def main() -> None:
    opts, shard, shards = options(__doc__, [512, 901, 2048, 4096], 5.0)
    registry.discover()
    print(f"# benchmarks/moe_grouped_sweep.py on {torch.cuda.get_device_name()}, {datetime.date.today()}, torch "
          f"{torch.__version__}, triton {triton.__version__}")
    rows = []
    sweep(fp8_grouped.moe_fp8_grouped, itertools.islice(configs(), shard, None, shards), fp8_grouped.CONFIGS,
          opts.seq_lens, time.time() + opts.minutes * 60, rows)
    if opts.json:
        write_json(opts.json, rows)


if __name__ == "__main__":
    main()
