"""Where `cuda_prefill_staged`'s eager host time goes, part by part, on the GPU machine: each part of
the call timed alone as benchmarks/hosttime.py times a call (until it returns, the device idle
before each), without cProfile's inflation. Parts: the whole registered call, the input checks and
alignment (`_aligned`, strides), the first launch with its two buffers (`algebra`, in CUDA for the
engines' conventions since 2026-12-02; the Triton `chunk_algebra` before, which
benchmarks/results/staged-host-parts-H200.txt timed), those two buffers alone, the first launch's NVRTC
launch alone, and the walk's launch alone (its buffers made once).

    python benchmarks/staged_host_parts.py [--shape total_seq_len=8,num_seqs=1,num_slots=2 ...]
        [--definition gdn_prefill_pool_qk4_v8] [--json out.json]

No FlashInfer needed (the staged variant only); after `. benchmarks/gpu_env.sh`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from hosttime import host_us, write_rows  # noqa: E402
from kdispatch import definitions, registry, workloads  # noqa: E402
from kdispatch.kernels.cuda.gdn import prefill_walk as pw  # noqa: E402
from variant_host import axes_of, parse_shape  # noqa: E402

VARIANT = "cuda_prefill_staged.r64s4"


def parts(args: tuple) -> dict:
    """name -> (callable, its arguments), the pool convention's call cut where `_walk` cuts it."""
    q, k, v, g, beta, pool, slots, init, cu, out, scale = args  # the pool prefill's input order
    hv, n = v.shape[1], cu.shape[0] - 1
    scale = pw._resolve_scale(scale, pw.DIM)
    warps, stages = pw.LAUNCH_CONFIGS[VARIANT.split(".")[1]]["cfg"]
    gates = (g, beta, None, None)
    mats, factors = pw.algebra(q, k, gates, cu, hv, scale, contest=False)
    kern = pw.kernel(warps, stages, True)
    first = pw._kernels[("algebra", "pool")]
    ss = pool.stride()

    def checks():
        pw._aligned(q), pw._aligned(k), pw._aligned(v)
        s = pool.stride()
        _ = s[-1] != 1 or (s[0] | s[1] | s[2]) & 1 or pool.data_ptr() % 8
        _ = out.stride() != (out.shape[1] * pw.DIM, pw.DIM, 1) or out.data_ptr() % 16

    def first_launch():
        first.launch((-(-q.shape[0] // 16), q.shape[1]), 32, q, k, g, beta, None, None, cu, mats, factors, float(scale),
                     q.shape[0], n, hv, q.shape[1], q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0),
                     beta.stride(0), stream=pw.nvrtc.current_stream(q.get_device()))

    def buffers():
        torch.empty(mats.numel(), device=q.device, dtype=mats.dtype)
        torch.empty(factors.numel(), device=q.device, dtype=factors.dtype)

    def walk_launch():
        kern.launch(n * hv * (pw.DIM // (16 * warps)), 32 * warps, q, k, v, mats, factors, pool, slots, init, cu,
                    out, q.shape[0], n, pool.shape[0], hv, q.shape[1], 1, q.stride(0), q.stride(1), k.stride(0),
                    k.stride(1), v.stride(0), v.stride(1), ss[0], ss[1], ss[2], None, None, None, None,
                    shmem=stages * pw.stage_bytes(warps), stream=pw.nvrtc.current_stream(q.get_device()))

    return {"checks": (checks, ()), "two buffers": (buffers, ()),
            "first launch (algebra)": (lambda: pw.algebra(q, k, gates, cu, hv, scale, contest=False), ()),
            "  its NVRTC launch": (first_launch, ()),
            "walk launch": (walk_launch, ())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--definition", default="gdn_prefill_pool_qk4_v8")
    ap.add_argument("--shape", type=parse_shape, action="append")
    ap.add_argument("--json")
    opts = ap.parse_args()
    full = definitions.resolve_name(opts.definition)
    rows = []
    for given in opts.shape or [{"total_seq_len": 8, "num_seqs": 1, "num_slots": 2}]:
        axes = axes_of(full, given)
        args = workloads.materialize(full, {"axes": axes, "inputs": {}, "uuid": "staged-host"}, device="cuda")
        whole = registry.get(full, VARIANT).fn
        row = {"axes": axes, "whole call": host_us(whole, args)}
        row |= {name: host_us(fn, a) for name, (fn, a) in parts(args).items()}
        rows.append(row)
        print(f"\n== {VARIANT} {given}: host us until it returns")
        for name, us in row.items():
            if name != "axes":
                print(f"   {us:7.1f}  {name}")
    if opts.json:
        write_rows(opts.json, rows)


if __name__ == "__main__":
    main()
