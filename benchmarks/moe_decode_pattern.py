"""What the MoE decode GEMMs' access pattern costs by itself, on the GPU machine: the hit experts'
gate/up (or down) FP8 weights read tile by tile as `_gemm1_splitk_kernel` / `_gemm2_kernel`
(kernels/triton/moe/fp8_decode.py) read them (a program per N tile, K split and expert, BLOCK_N rows x
BLOCK_K bytes a step, each step one FP8 tensor-core dot against a 16-row activation tile), with none of
their scales, routing lookups, atomics or epilogues, beside a plain streaming read of the same bytes
(moe_decode_sweep.py's `_stream_kernel`). So a decode kernel's time splits into what its tiles' reads
cost at best and what the kernel adds. CUDA-graph time per call, the weights rotated over copies past
the L2 (as the tuner times); needs only torch and Triton.

    python benchmarks/moe_decode_pattern.py [--experts 1 3] [--down]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import triton
import triton.language as tl

from kdispatch.tuner import timing

from moe_decode_sweep import stream_us  # noqa: E402  (benchmarks/ is the script folder)

COPIES = 5  # weight copies rotated: past the 50-60 MB L2 at one expert already
# (BLOCK_N, BLOCK_K, K split, stages, warps); the first of each list is the registered kernels' tile
# (n128s8q: gate/up 64 x 128 split 8, down 128 x 128 split 4)
GATE_UP_TILES = [(64, 128, 8, 3, 4), (64, 128, 8, 5, 4), (64, 128, 4, 3, 4), (64, 128, 8, 3, 8), (128, 128, 8, 3, 4),
                 (32, 256, 7, 3, 4), (64, 256, 7, 3, 4), (32, 512, 2, 3, 4), (16, 512, 7, 2, 4), (16, 512, 14, 1, 4),
                 (16, 1024, 7, 1, 4), (16, 512, 1, 3, 4)]
DOWN_TILES = [(128, 128, 4, 3, 4), (64, 128, 4, 3, 4), (128, 128, 2, 3, 4), (64, 256, 2, 3, 4), (32, 512, 1, 3, 4)]


@triton.jit
def _tile_read_kernel(w_ptr, out_ptr, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, STEPS: tl.constexpr, STAGES: tl.constexpr):
    """Program (N tile, K split, expert): STEPS [BLOCK_N, BLOCK_K] weight tiles, each into a dot."""
    pid_n, split, e = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tile = (w_ptr + e.to(tl.int64) * N * K + rows[:, None].to(tl.int64) * K + split * STEPS * BLOCK_K
            + tl.arange(0, BLOCK_K)[None, :])
    a = tl.full([16, BLOCK_K], 1.0, tl.float32).to(tl.float8e4nv)
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    for i in tl.range(STEPS, num_stages=STAGES):
        acc += tl.dot(a, tl.trans(tl.load(tile + i * BLOCK_K)))
    tl.store(out_ptr + (e * tl.num_programs(1) + split) * N + rows, tl.sum(acc, axis=0))


def tile_read_us(copies: list, n: int, k: int, block_n: int, block_k: int, split: int, stages: int,
                 warps: int) -> float:
    experts = copies[0].shape[0]
    out = torch.empty(experts * split * n, device=copies[0].device)

    def fn(w):
        _tile_read_kernel[(n // block_n, split, experts)](w, out, n, k, block_n, block_k, k // block_k // split,
                                                          stages, num_warps=warps)
        return out
    return statistics.median(timing.graph_times_us(fn, [[w] for w in copies], 5)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, nargs="+", default=[1, 3], help="hit experts' weights read a call")
    ap.add_argument("--down", action="store_true", help="the down projection's weights (else gate/up)")
    opts = ap.parse_args()
    n, k = (7168, 2048) if opts.down else (4096, 7168)
    print(f"# benchmarks/moe_decode_pattern.py{' --down' if opts.down else ''} on {torch.cuda.get_device_name()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, torch {torch.__version__}, triton "
          f"{triton.__version__}: us per call (CUDA graph, {COPIES} weight copies rotated)", flush=True)
    for experts in opts.experts:
        copies = [torch.randn(experts, n, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(COPIES)]
        nbytes = copies[0].numel()
        print(f"## {experts} expert(s), {'down' if opts.down else 'gate/up'} weights {nbytes / 1e6:.1f} MB")
        rows = [(f"tiles {bn} x {bk} B, K split {split} ({k // bk // split} steps), {stages} stages, {warps} warps, "
                 f"{n // bn * split * experts} programs", tile_read_us(copies, n, k, bn, bk, split, stages, warps))
                for bn, bk, split, stages, warps in (DOWN_TILES if opts.down else GATE_UP_TILES)]
        pool = torch.cat([c.view(torch.int64).flatten() for c in copies])
        rows.append(("plain read, 4 KB a program", stream_us(nbytes, pool, 512, 1, 4)))
        for name, t in rows:
            print(f"{name:75s} {t:7.1f} us  {nbytes / t / 1e6:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
