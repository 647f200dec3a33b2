"""Launch-layout sweep of the CUDA GDN prefill kernel (kernels/cuda/gdn/prefill_thread_rows.cu),
used to pick `config()` and to compare an edited copy of the kernel with the committed one:
CUDA-graph µs per call for every compiled (KSPLIT, ROWS, CHUNK) on contest-like (total tokens,
sequences) partitions.  GPU only.

    python benchmarks/gdn_prefill_sweep.py [--alt LABEL=path/to/copy.cu ...] [--json out.json]
    ncu --clock-control none --set full -k regex:gdn_prefill --launch-skip 1 --launch-count 1 \\
        python benchmarks/gdn_prefill_sweep.py --profile 134 1     (the variant's call, twice)

Every source is launched exactly as the variant launches its own, so timings compare like with
like.  Inputs are reused across replays (prefill states are small): the tuner gives routed numbers.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from kdispatch import nvrtc
from kdispatch.kernels.cuda.gdn import prefill_thread_rows as PT
from kdispatch.tuner import timing

SHAPES = [[6], [16], [30], [67], [134], [67, 67], [16] * 4, [64] * 4, [32] * 8, [491, 492], [950, 953, 954],
          [2107], [256] * 32]


def inputs(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    T, N = sum(lengths), len(lengths)
    unit = lambda *s: torch.nn.functional.normalize(torch.randn(*s, generator=g), dim=-1).to(torch.bfloat16).cuda()  # noqa: E731
    q, k = unit(T, 4, 128), unit(T, 4, 128)
    v = torch.randn(T, 8, 128, generator=g).to(torch.bfloat16).cuda()
    state = (torch.randn(N, 8, 128, 128, generator=g) * 0.1).cuda()
    A_log, dt_bias = (torch.randn(8, generator=g) * 0.5).cuda(), (torch.randn(8, generator=g) * 0.5).cuda()
    a, b = [(torch.randn(T, 8, generator=g) * 2).to(torch.bfloat16).cuda() for _ in range(2)]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int64).cuda()
    return q, k, v, state, A_log, a, dt_bias, b, cu


def graph_us(fn, args, calls: int = 20) -> float:
    """Median µs per call of a CUDA graph of `calls` calls fn(*args) (kdispatch.tuner.timing: the
    captured work is checked; one call per graph would time the graph launch)."""
    times, _ = timing.graph_times_us(fn, [args] * calls, reps=7)
    return statistics.median(times)


def launcher(source: Path, ksplit: int, rows: int, chunk: int, N: int):
    kern = nvrtc.load_kernel(source, f"gdn_prefill_thread_rows_k{ksplit}_r{rows}_c{chunk}", signature=PT.SIGNATURE)

    def call(q, k, v, state, A_log, a, dt_bias, b, cu):
        out = torch.empty(q.shape[0], 8, 128, dtype=torch.bfloat16, device=q.device)
        kern.launch(N * 8 * (128 // rows), rows * ksplit, q, k, v, state, A_log, a, dt_bias, b, cu, out, 128 ** -0.5, q.shape[0])
        return out
    return call


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alt", nargs="+", default=[], metavar="LABEL=PATH", help="other copies of the .cu to time")
    ap.add_argument("--json")
    ap.add_argument("--profile", type=int, nargs=2, metavar=("T", "N"),
                    help="only call the variant twice on T tokens in N sequences")
    opts = ap.parse_args()
    if opts.profile:
        T, N = opts.profile
        args = inputs([T // N + (i < T % N) for i in range(N)])
        for _ in range(2):  # compile, then the call to profile
            PT.gdn_prefill_thread_rows(*args, 128 ** -0.5)
        torch.cuda.synchronize()
        return
    sources = {"committed": PT.CU, **{a.split("=", 1)[0]: Path(a.split("=", 1)[1]) for a in opts.alt}}
    rows = []
    for lengths in SHAPES:
        T, N = sum(lengths), len(lengths)
        args = inputs(lengths)
        times = {f"{label} k{ks}r{r}c{c}": graph_us(launcher(src, ks, r, c, N), args)
                 for label, src in sources.items() for c, layouts in PT.CHUNKS.items() for ks, r in layouts}
        rows.append({"T": T, "N": N, "us": times})
        default = "k{}r{}c{}".format(*PT.config(N, T))
        best = {label: min((t, n.split()[1]) for n, t in times.items() if n.startswith(label + " "))
                for label in sources}
        print(f"T={T:5d} N={N:3d}  " + "  ".join(
            f"{label}: default {default} {times[f'{label} {default}']:7.1f}, best {b[1]} {b[0]:7.1f}"
            for label, b in best.items()), flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "sources": {k: str(v) for k, v in sources.items()},
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
