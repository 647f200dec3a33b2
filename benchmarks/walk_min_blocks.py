"""The staged prefill's walk (kernels/cuda/gdn/prefill_walk.cu) built with a minimum of resident blocks
per SM in its launch bounds (`__launch_bounds__(32 W, M)`: ptxas keeps the registers under what M
blocks need) against the committed build, side by side on the GPU machine: each build's registers,
spill bytes and resident blocks per SM, then per shape the variant with each build in alternating
rounds (benchmarks/moe_host_ab.py `side_by_side`: graph time over input sets rotated past the L2,
eager, host), the outputs compared with the committed build's (the same arithmetic: they match bit
for bit unless the compiler reorders it).

Why: at the pool prefills' shapes short of issue 18's 2x the walk is most of the device time and
doubles with the (sequence, head) pairs at a fixed walk length
(benchmarks/results/variant-host-staged-qk16-H200.txt): 512 blocks take two waves at 3 blocks an SM,
which both its registers and its shared memory set (benchmarks/results/walk-ncu-H200.txt).

    python benchmarks/walk_min_blocks.py --min-blocks 3 4 \\
        --shape gdn_prefill_pool_qk16_v32:total_seq_len=2048,num_seqs=8,num_slots=9 [--rounds 3] [--carveout 100]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from kdispatch import definitions, nvrtc, registry  # noqa: E402
from kdispatch.kernels.cuda.gdn import prefill_walk  # noqa: E402
from kdispatch.tuner import timing  # noqa: E402
from kdispatch.workloads import SimpleWorkload, materialize  # noqa: E402
from moe_host_ab import side_by_side  # noqa: E402

BOUNDS = "__launch_bounds__(32 * W)"


def build(warps: int, stages: int, min_blocks: int, carveout: int | None) -> nvrtc.Kernel:
    """The pool walk of `warps` warps and `stages` stages, launch bounds asking for `min_blocks` blocks
    an SM; `carveout`: the shared memory carveout it prefers (percent of the unified L1: the driver's
    default choice held the committed walk to 3 blocks an SM by shared memory too, ncu's Occupancy)."""
    source = prefill_walk.CU.read_text()
    if source.count(BOUNDS) != 1:
        raise SystemExit(f"walk_min_blocks: {BOUNDS} not found once in {prefill_walk.CU.name}")
    source = source.replace(BOUNDS, f"__launch_bounds__(32 * W, {min_blocks})")
    kern = nvrtc.load_kernel(source, f"gdn_prefill_walk_w{warps}_s{stages}_pool", signature=prefill_walk.SIGNATURE)
    kern.set_attribute("MAX_DYNAMIC_SHARED_SIZE_BYTES", stages * prefill_walk.stage_bytes(warps))
    if carveout is not None:
        kern.set_attribute("PREFERRED_SHARED_MEMORY_CARVEOUT", carveout)
    return kern


def resident(kern: nvrtc.Kernel, warps: int, stages: int) -> int:
    """Blocks of this kernel one SM holds at once (cuda.core's occupancy calculator)."""
    occupancy = kern.core.occupancy
    return int(occupancy.max_active_blocks_per_multiprocessor(32 * warps, stages * prefill_walk.stage_bytes(warps)))


def with_kernel(fn, key, kern):
    """`fn` with the walk of `key` = (warps, stages, pooled) served by `kern`."""
    def call(*args):
        saved = prefill_walk._kernels.get(key)
        prefill_walk._kernels[key] = kern
        try:
            return fn(*args)
        finally:
            prefill_walk._kernels[key] = saved
    return call


def parse_shape(text: str) -> tuple[str, dict[str, int]]:
    name, _, axes = text.partition(":")
    return definitions.resolve_name(name), {k: int(v) for k, v in (kv.split("=") for kv in axes.split(","))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-blocks", type=int, nargs="+", required=True)
    ap.add_argument("--shape", type=parse_shape, action="append", required=True, help="definition:axis=v,axis=v")
    ap.add_argument("--config", default="r64s4", help=f"one of {sorted(prefill_walk.LAUNCH_CONFIGS)}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--carveout", type=int, help="the builds' preferred shared memory carveout, percent")
    opts = ap.parse_args()
    registry.discover()
    warps, stages = prefill_walk.LAUNCH_CONFIGS[opts.config]["cfg"]
    key = (warps, stages, True)
    committed = prefill_walk.kernel(warps, stages, True)
    builds = {"committed": committed} | {f"min{m}": build(warps, stages, m, opts.carveout) for m in opts.min_blocks}
    print(f"# benchmarks/walk_min_blocks.py on {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, "
          f"cuda_prefill_staged.{opts.config}, carveout {opts.carveout}: us per call, medians of {opts.rounds} "
          "alternating rounds")
    for label, kern in builds.items():
        print(f"# {label}: {kern.resources()}, {resident(kern, warps, stages)} blocks an SM")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for definition, axes in opts.shape:
        base = registry.get(definition, f"cuda_prefill_staged.{opts.config}").fn
        args = list(materialize(definition, SimpleWorkload(axes, uuid="walk-min-blocks"), device="cuda", seed=0))
        sets = timing.input_sets(definition, args, l2, max_sets=16)
        fns = {label: with_kernel(base, key, kern) for label, kern in builds.items()}
        fresh = lambda: [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # noqa: E731  (pools update in place)
        outs = {label: [t.float() for t in fn(*fresh())] for label, fn in fns.items()}
        short = definitions.get(definition).short
        for label in builds:
            if label == "committed":
                continue
            same = all(torch.equal(a, b) for a, b in zip(outs["committed"], outs[label]))
            diff = max((a - b).abs().max().item() for a, b in zip(outs["committed"], outs[label]))
            finite = all(bool(torch.isfinite(t).all()) for t in outs[label])
            cols = side_by_side(fns["committed"], fns[label], sets, opts.rounds)
            print(f"{short} {axes} committed -> {label}: {cols}; bit-equal {same}, max|diff| {diff:.3g}, "
                  f"finite {finite}", flush=True)


if __name__ == "__main__":
    main()
