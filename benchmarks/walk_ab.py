"""The staged prefill's walk (kernels/cuda/gdn/prefill_walk.cu) as built from this tree against other
builds of it, side by side on the GPU machine: the walk of another source file (an earlier revision:
`git show REV:kernels/cuda/gdn/prefill_walk.cu > old.cu`), or this tree's built with a minimum of
resident blocks per SM in its launch bounds (`__launch_bounds__(32 W, M)`: ptxas keeps the registers
under what M blocks need). Prints each build's registers, spill bytes and resident blocks per SM, then
per shape the variant with each build in alternating rounds (benchmarks/moe_host_ab.py `side_by_side`:
graph time over input sets rotated past the L2, eager, host) and its outputs against this tree's
(a change of addressing alone keeps them bit-equal).

Why: at the pool prefills' shapes short of issue 18's 2x the walk is most of the device time and
doubles with the (sequence, head) pairs at a fixed walk length
(benchmarks/results/variant-host-staged-qk16-H200.txt): 512 blocks take two waves at 3 blocks an SM,
which both its registers and its shared memory set, and its loop issues ~16 instructions for each mma
(benchmarks/results/walk-ncu-H200.txt).

    python benchmarks/walk_ab.py [--source old.cu ...] [--min-blocks 3 4] [--carveout 100] \\
        --shape gdn_prefill_pool_qk16_v32:total_seq_len=2048,num_seqs=8,num_slots=9 [--rounds 3]
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
CONTEST = "gdn_prefill_qk4_v8_d128_k_last"  # int64 cu_seqlens, a state a sequence: the `contest` walk


def build(source: str, warps: int, stages: int, pooled: bool, carveout: int | None) -> nvrtc.Kernel:
    """The walk of `warps` warps and `stages` stages from `source`; `carveout`: the shared memory
    carveout it prefers (percent of the unified L1: the driver's default choice held the committed
    walk to 3 blocks an SM by shared memory too, ncu's Occupancy)."""
    name = f"gdn_prefill_walk_w{warps}_s{stages}_{'pool' if pooled else 'contest'}"
    kern = nvrtc.load_kernel(source, name, signature=prefill_walk.SIGNATURE)
    kern.set_attribute("MAX_DYNAMIC_SHARED_SIZE_BYTES", stages * prefill_walk.stage_bytes(warps))
    if carveout is not None:
        kern.set_attribute("PREFERRED_SHARED_MEMORY_CARVEOUT", carveout)
    return kern


def with_min_blocks(source: str, min_blocks: int) -> str:
    if source.count(BOUNDS) != 1:
        raise SystemExit(f"walk_ab: {BOUNDS} not found once in {prefill_walk.CU.name}")
    return source.replace(BOUNDS, f"__launch_bounds__(32 * W, {min_blocks})")


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
    ap.add_argument("--source", type=Path, nargs="+", default=[], help="other sources of the walk")
    ap.add_argument("--min-blocks", type=int, nargs="+", default=[])
    ap.add_argument("--shape", type=parse_shape, action="append", required=True, help="definition:axis=v,axis=v")
    ap.add_argument("--config", default="r64s4", help=f"one of {sorted(prefill_walk.LAUNCH_CONFIGS)}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--carveout", type=int, help="the other builds' preferred shared memory carveout, percent")
    opts = ap.parse_args()
    registry.discover()
    warps, stages = prefill_walk.LAUNCH_CONFIGS[opts.config]["cfg"]
    tree = prefill_walk.CU.read_text()
    others = {p.name: p.read_text() for p in opts.source} | {
        f"min{m}": with_min_blocks(tree, m) for m in opts.min_blocks}
    print(f"# benchmarks/walk_ab.py on {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, "
          f"cuda_prefill_staged.{opts.config}, carveout {opts.carveout}: us per call, this tree -> each other "
          f"build, medians of {opts.rounds} alternating rounds")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for definition, axes in opts.shape:
        pooled = definition != CONTEST
        key = (warps, stages, pooled)  # prefill_walk._kernels: the staged walk's
        builds = {"tree": prefill_walk.kernel(warps, stages, pooled)} | {
            label: build(source, warps, stages, pooled, opts.carveout) for label, source in others.items()}
        for label, kern in builds.items():
            print(f"# {label} ({'pool' if pooled else 'contest'}): {kern.resources()}, "
                  f"{resident(kern, warps, stages)} blocks an SM")
        base = registry.get(definition, f"cuda_prefill_staged.{opts.config}").fn
        args = list(materialize(definition, SimpleWorkload(axes, uuid="walk-ab"), device="cuda", seed=0))
        sets = timing.input_sets(definition, args, l2, max_sets=16)
        fns = {label: with_kernel(base, key, kern) for label, kern in builds.items()}
        fresh = lambda: [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # noqa: E731  (pools update in place)
        outs = {label: [t.float() for t in fn(*fresh())] for label, fn in fns.items()}
        short = definitions.get(definition).short
        for label in others:
            same = all(torch.equal(a, b) for a, b in zip(outs["tree"], outs[label]))
            diff = max((a - b).abs().max().item() for a, b in zip(outs["tree"], outs[label]))
            finite = all(bool(torch.isfinite(t).all()) for t in outs[label])
            cols = side_by_side(fns["tree"], fns[label], sets, opts.rounds)
            print(f"{short} {axes} tree -> {label}: {cols}; bit-equal {same}, max|diff| {diff:.3g}, "
                  f"finite {finite}", flush=True)


if __name__ == "__main__":
    main()
