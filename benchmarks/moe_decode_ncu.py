"""A few calls of a MoE decode configuration at one batch size, and a plain read of its hit experts'
weight bytes beside them, for Nsight Compute: why the decode GEMMs take 1.5-1.7x a read of their
bytes at one token (results/moe-stream-ceiling-H200.txt). On the GPU machine, from the project root:

    ncu --clock-control none --kernel-name regex:"_route|_gemm|_stream" --launch-skip 4 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section LaunchStats --section Occupancy python benchmarks/moe_decode_ncu.py [--seq-len 1] [--config n128s8q]

ncu flushes the caches before each profiled kernel (its default), so every kernel reads its weights
from HBM as in the tuner's rotated timings. Prints the experts the routing hits and their bytes."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_decode_sweep import EXPERT_BYTES_1, EXPERT_BYTES_2, _stream_kernel  # noqa: E402

from kdispatch.kernels.triton.moe import fp8_decode  # noqa: E402
from kdispatch.references import moe_fp8 as ref  # noqa: E402
from kdispatch.workloads import SimpleWorkload, materialize  # noqa: E402

STREAM = (512, 1, 4)  # words a load, loads a program, warps: the best shape at one expert (moe_decode_sweep)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq-len", type=int, default=1)
    ap.add_argument("--config", default="n128s8q", choices=sorted(fp8_decode.CONFIGS))
    ap.add_argument("--calls", type=int, default=3, help="calls after two warm-up calls")
    opts = ap.parse_args()
    args = list(materialize("moe_fp8", SimpleWorkload({"seq_len": opts.seq_len}, uuid=f"ncu-{opts.seq_len}"),
                            device="cuda", seed=0))
    experts, _ = ref._route(args[0], args[1], args[9])
    offset, num_local = int(args[8]), args[4].shape[0]
    hit = sorted({e - offset for e in experts.flatten().tolist() if 0 <= e - offset < num_local})
    print(f"seq_len {opts.seq_len}, {opts.config}: local experts hit {hit} ({len(hit)})", flush=True)
    for _ in range(2):
        fp8_decode.moe_fp8_decode(*args, **fp8_decode.CONFIGS[opts.config])
    words = max(1, len(hit)) * (EXPERT_BYTES_1 + EXPERT_BYTES_2) // 8
    pool = torch.randint(-2**62, 2**62, (words,), dtype=torch.int64, device="cuda")
    out = torch.empty(triton.cdiv(words, STREAM[0] * STREAM[1]), dtype=torch.int64, device="cuda")
    for _ in range(opts.calls):
        fp8_decode.moe_fp8_decode(*args, **fp8_decode.CONFIGS[opts.config])
        _stream_kernel[(out.numel(),)](pool, out, words, STREAM[0], STREAM[1], num_warps=STREAM[2])
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
