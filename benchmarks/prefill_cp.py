"""The context-parallel prefill (`cuda_prefill_cp.p<P>`, kernels/cuda/gdn/prefill_cp.py) beside the
staged walk it splits (`cuda_prefill_staged`) and any other variants named, on the GPU machine: per
shape, each variant's error against the definition's reference (output and final states, max |diff| over
max |reference|, on fresh inputs) and its graph time (inputs rotated past the L2, the tuner's
timing.graph_times_us) and eager time, side by side in one run.

Why: the walk runs each (sequence, value head) pair's 16-token blocks in order, one warp a 16 rows, so a
few long sequences leave most SMs idle and the time grows with the longest sequence
(benchmarks/results/gdn-fused-grid-H200.txt: ~0.8-1 us a block at 1 x 2,048 tokens at every head count);
CP walks P segments of every sequence at once.

    python benchmarks/prefill_cp.py [--definitions gdn_prefill_pool_qk2_v4 ...] \\
        [--shapes 1x2048 4x512 8x4096/skewed ...] [--variants cuda_prefill_staged.r64s4 cuda_prefill_cp.p8 ...] \\
        [--replays N] [--check reference|first] [--kernels] [--unoffered] [--json out.json]

A shape is SEQSxTOKENS with random cut points, or SEQSxTOKENS/MIX with one of the coverage sets' length
mixes (the definition spec's prefill_mix: "skewed", one long sequence among short ones; "equal");
"skewed@I" puts the long sequence at index I (-1: last), to see what its place in the batch costs.

`--unoffered` times a variant also where its `supports` declines the shape (whether to offer it there:
CP under CP_MIN_TOKENS, say). `--kernels` adds, under each shape's row, every variant's kernels and their device time per call
(torch.profiler over eager calls, benchmarks/hosttime.py): where a variant's time goes, launch by launch.

A variant a definition does not register (another definition's baseline) is skipped there ("-").
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from hosttime import kernel_times  # noqa: E402
from kdispatch import arch, definitions, registry  # noqa: E402
from kdispatch.definitions.gdn.spec import prefill_mix  # noqa: E402
from kdispatch.tuner import timing  # noqa: E402
from kdispatch.workloads import SimpleWorkload, materialize  # noqa: E402

DEFINITIONS = ("gdn_prefill_pool_qk2_v4_d128_k_last", "gdn_prefill_pool_qk16_v32_d128_k_last")
SHAPES = ("1x2048", "1x8192", "4x512", "4x4096", "16x1024")
VARIANTS = ("cuda_prefill_staged.r64s4", "cuda_prefill_staged.r32s4", "cuda_prefill_cp.p4", "cuda_prefill_cp.p8",
            "cuda_prefill_cp.p16", "sglang_flashinfer_prefill", "flashinfer")  # the baselines of pool and contest


def axes_of(definition: str, shape: str) -> dict[str, int]:
    seqs, total = (int(x) for x in shape.split("/")[0].split("x"))
    axes = {"num_seqs": seqs, "total_seq_len": total, "len_cu_seqlens": seqs + 1}
    if "num_slots" in definitions.get(definition).var_axes:
        axes["num_slots"] = seqs + 1
    return axes


def placed_longest(cu: torch.Tensor, at: int) -> torch.Tensor:
    """The boundaries with the longest sequence moved to index `at`, the others in their order."""
    lens = (cu[1:] - cu[:-1]).tolist()
    longest = lens.pop(max(range(len(lens)), key=lens.__getitem__))
    lens.insert(at if at >= 0 else len(lens) + 1 + at, longest)
    return torch.tensor([0] + lens, dtype=cu.dtype).cumsum(0).to(cu.dtype)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--definitions", nargs="+", default=DEFINITIONS)
    ap.add_argument("--shapes", nargs="+", default=SHAPES, help="SEQSxTOKENS")
    ap.add_argument("--variants", nargs="+", default=VARIANTS)
    ap.add_argument("--replays", type=int, default=5, help="graph replays a variant (their median and p90)")
    ap.add_argument("--check", choices=("reference", "first"), default="reference",
                    help="errors against the definition's reference, or against the first variant run on the "
                         "shape (no reference call, which walks the batch on the host: quicker A/B runs)")
    ap.add_argument("--kernels", action="store_true",
                    help="each variant's kernels and their device time per call, under the shape's row")
    ap.add_argument("--unoffered", action="store_true",
                    help="time variants also on shapes their `supports` declines")
    ap.add_argument("--json")
    opts = ap.parse_args()
    registry.discover()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    print(f"# benchmarks/prefill_cp.py on {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}: us per call "
          f"(graph: median of graph replays over rotated input sets; eager: median of synchronised calls), "
          f"error = max |variant - reference| / max |reference| (output / states)")
    for name in opts.definitions:
        definition = definitions.resolve_name(name)
        ref = registry.get(definition, "reference").fn
        print(f"\n{definition}\n{'shape':>20} " + " ".join(f"{v:>34}" for v in opts.variants))
        for shape in opts.shapes:
            axes = axes_of(definition, shape)
            args = list(materialize(definition, SimpleWorkload(axes, uuid=f"cp-{shape}"), device="cuda", seed=1))
            if "/" in shape:  # the mix's boundaries over the random ones
                mix, _, at = shape.split("/")[1].partition("@")
                mixed = prefill_mix(axes, mix, torch.Generator().manual_seed(1))
                if "cu_seqlens" not in mixed:
                    raise SystemExit(f"prefill_cp: no length mix {mix!r} (skewed, equal)")
                if at:
                    mixed["cu_seqlens"] = placed_longest(mixed["cu_seqlens"], int(at))
                args[list(definitions.get(definition).inputs).index("cu_seqlens")].copy_(mixed["cu_seqlens"])
            fresh = lambda: [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # noqa: E731
            want = [t.float() for t in ref(*fresh())[:2]] if opts.check == "reference" else None
            sets = timing.input_sets(definition, args, l2)
            cells, parts = [], []
            for vname in opts.variants:
                row = {"definition": definition, "shape": shape, "variant": vname}
                try:
                    v = registry.get(definition, vname)
                    why = v.why_not(arch.local_arch()) or (None if opts.unoffered else v.declines(axes))
                except KeyError:  # not registered for this definition (a baseline of another, CP at 32 heads)
                    why = "not registered"
                if why:
                    row["skipped"] = why
                    cells.append(f"{'-':>34}")
                else:
                    work = fresh()
                    for i, a in enumerate(work):  # poison the outputs the call must write
                        if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 and a.dim() == 3 and i > 2:
                            a.fill_(float("nan"))
                    got = v.fn(*work)[:2]
                    if want is None:  # --check first: this variant's results are the others' yardstick
                        want = [t.float().clone() for t in got]
                    row["out_err"], row["state_err"] = rel_err(got[0], want[0]), rel_err(got[1], want[1])
                    replays = timing.graph_times_us(v.fn, sets, opts.replays)[0]
                    row["graph_us"] = statistics.median(replays)
                    row["graph_p90_us"] = statistics.quantiles(replays, n=10)[-1] if len(replays) > 1 else replays[0]
                    row["eager_us"] = statistics.median(timing.eager_times_us(v.fn, sets, 30))
                    if opts.kernels:
                        row["kernels_us"] = kernel_times(v.fn, fresh())
                        parts.append(f"{'':>20}   {vname}: " + ", ".join(
                            f"{k.split('(')[0][:48]} {t:.1f}" for k, t in row["kernels_us"].items()))
                    cells.append(f"{row['graph_us']:8.1f} {row['graph_p90_us']:7.1f} {row['eager_us']:7.1f} "
                                 f"{row['out_err']:.1e}/{row['state_err']:.1e}")
                rows.append(row)
            print(f"{shape:>20} " + " ".join(cells), flush=True)
            for line in parts:
                print(line, flush=True)
    print("\ncells: graph us (median, p90 of the replays), eager us, output / state error"
          + (" against the first variant run on the shape" if opts.check == "first" else ""))
    if opts.json:
        Path(opts.json).write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": time.strftime(
            "%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
