"""Launch configurations of the MoE decode kernels (kernels/triton/moe/fp8_decode.py) beyond the
registered ones, on the GPU machine: for each batch size and configuration, the call's CUDA-graph time
(inputs rotated past the L2, as the tuner times) against the floor (benchmarks/floors.py), and each
kernel's device time under torch.profiler over the same rotated inputs. Also the HBM read ceiling: a
plain streaming kernel over as many bytes as the hit experts' weights, so the floor's distance is
split into what streaming itself loses and what the kernels add. What to register as CONFIGS, measured
rather than guessed; needs only torch and Triton (no bundles).

    python benchmarks/moe_decode_sweep.py [--seq-lens 1 8 32] [--minutes 6] [--shard I/N] [--json out.json] [--fused]

--shard I/N measures every N-th configuration from the I-th (one process a GPU: benchmarks/on_gpus.sh);
shard 0 also measures the streaming ceiling. --fused: both GEMMs in one launch (`fused_gemms`) over a
grid of their own instead (the registered ones were only ever timed with 4 warps and 3 stages).
"""
from __future__ import annotations

import argparse
import collections
import datetime
import itertools
import json
import statistics
import time

import torch
import triton
import triton.language as tl

from kdispatch import registry
from kdispatch.kernels.triton.moe import fp8_decode
from kdispatch.tuner import timing
from kdispatch.workloads import SimpleWorkload, materialize

from floors import floor_us, peak_bandwidth  # noqa: E402  (benchmarks/ is the script folder)

DEF = "moe_fp8"
EXPERT_BYTES_1 = 2 * 2048 * 7168  # one expert's gate/up FP8 weights
EXPERT_BYTES_2 = 7168 * 2048  # its down weights


@triton.jit
def _stream_kernel(src_ptr, out_ptr, n_words, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """Reads STEPS consecutive BLOCK-word chunks a program, int64 words, xor-reduced into one word."""
    base = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    for i in range(STEPS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(src_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + tl.program_id(0), tl.xor_sum(acc, axis=0))


# (words a load, loads a program, warps): one 8-KB load a program keeps the most bytes in flight. On the
# H200 (2026-11-29) it read one expert's gate/up weights in 8.1 us, where 64 KB a program, the only
# shape this script tried before, took 13.4
STREAM_CONFIGS = ((1024, 1, 4), (512, 1, 4), (2048, 1, 8), (1024, 8, 4), (2048, 4, 4), (512, 16, 4))


def stream_us(nbytes: int, pool: torch.Tensor, block: int, steps: int, warps: int) -> float:
    """Graph time of reading `nbytes` of the pool, a different slice each replay (past the L2)."""
    words = nbytes // 8
    slices = [pool[i * words:(i + 1) * words] for i in range(pool.numel() // words)][:16]
    grid = triton.cdiv(words, block * steps)
    out = torch.empty(grid, dtype=torch.int64, device=pool.device)

    def fn(src):
        _stream_kernel[(grid,)](src, out, words, block, steps, num_warps=warps)
        return out
    return statistics.median(timing.graph_times_us(fn, [[s] for s in slices], 5)[0])


def kernel_times(fn, sets) -> dict[str, float]:
    """Device microseconds per call of each kernel, one call per rotated input set."""
    for s in sets[:2]:
        fn(*s)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for s in sets:
            fn(*s)
        torch.cuda.synchronize()
    per = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name.lstrip("_").replace("_kernel", "")] += e.time_range.elapsed_us() / len(sets)
    return dict(per)


def configs(fused: bool = False):
    """The registered ones first, then a grid over tile widths, K splits, warps and stages (with `fused`
    a grid of fused-GEMM ones)."""
    yield from fp8_decode.CONFIGS.items()
    if fused:
        for (n1, n2), (s1, s2), (w, st) in itertools.product(
                ((64, 128), (64, 64), (32, 64)), ((4, 2), (8, 4), (7, 4)), ((4, 2), (4, 3), (8, 2), (8, 3))):
            yield (f"n{n1}-{n2}s{s1}-{s2}w{w}p{st}qf", dict(block_n1=n1, block_n2=n2, split_k=s1, split_k2=s2,
                                                          num_warps=w, num_stages=st, fp8_down=True, fused_gemms=True))
        return
    for (n1, n2), (s1, s2), (w, st) in itertools.product(
            ((32, 64), (64, 64), (64, 128), (128, 128), (32, 128)),
            ((4, 2), (8, 4), (14, 8), (7, 4), (8, 8), (14, 4)),
            ((4, 3), (4, 4), (8, 3), (2, 3), (4, 2))):
        yield (f"n{n1}-{n2}s{s1}-{s2}w{w}p{st}q",
               dict(block_n1=n1, block_n2=n2, split_k=s1, split_k2=s2, num_warps=w, num_stages=st, fp8_down=True))


def sweep(call, named_configs, registered: dict, seq_lens, deadline: float, rows: list) -> None:
    """For each batch size, `call(*inputs, **config)` for each (name, config) until the deadline: graph
    time against the floor and each kernel's device time, into `rows`; prints the best twelve and the
    registered ones."""
    named_configs = list(named_configs)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for seq_len in seq_lens:
        axes = {"seq_len": seq_len}
        args = list(materialize(DEF, SimpleWorkload(axes, uuid=f"sweep-{seq_len}"), device="cuda", seed=0))
        sets = timing.input_sets(DEF, args, l2, max_sets=8)
        floor = floor_us(DEF, args, axes)
        print(f"== seq_len {seq_len}: floor {floor:.1f} us", flush=True)
        measured = []
        for name, cfg in named_configs:
            if time.time() > deadline:
                print("  (time is up: the rest not measured)")
                break

            def fn(*a, cfg=cfg):
                return call(*a, **cfg)
            try:
                graph = statistics.median(timing.graph_times_us(fn, sets, 5)[0])
                kernels = kernel_times(fn, sets)
            except Exception as exc:  # a configuration the compiler refuses (shared memory)
                print(f"  {name}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            measured.append((graph, name, kernels))
            rows.append(dict(kind="config", seq_len=seq_len, config=name, **cfg, graph_us=graph, floor_us=floor,
                             kernels=kernels))
        measured.sort()
        for graph, name, kernels in measured[:12]:
            parts = "  ".join(f"{k} {v:.1f}" for k, v in sorted(kernels.items(), key=lambda kv: -kv[1]))
            print(f"  {name:24s} graph {graph:6.1f} us  {graph / floor:4.2f}x floor  | {parts}")
        for graph, name, kernels in measured:
            if name in registered:
                print(f"  registered {name:13s} graph {graph:6.1f} us  {graph / floor:4.2f}x floor")


def write_json(path: str, rows: list) -> None:
    with open(path, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), date=str(datetime.date.today()), torch=torch.__version__,
                       triton=triton.__version__, rows=rows), f, indent=1)


def options(doc: str, seq_lens: list[int], minutes: float):
    """A sweep script's options (its docstring's usage line) and its (shard, shards)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--seq-lens", type=int, nargs="+", default=seq_lens)
    ap.add_argument("--minutes", type=float, default=minutes)
    ap.add_argument("--shard", default="0/1")
    ap.add_argument("--json")
    ap.add_argument("--fused", action="store_true", help="the fused-GEMM configurations (moe_decode_sweep.py)")
    opts = ap.parse_args()
    shard, shards = map(int, opts.shard.split("/"))
    return opts, shard, shards


def main() -> None:
    opts, shard, shards = options(__doc__, [1, 8, 32], 6.0)
    registry.discover()
    deadline = time.time() + opts.minutes * 60
    print(f"# benchmarks/moe_decode_sweep.py on {torch.cuda.get_device_name()}, {datetime.date.today()}, torch "
          f"{torch.__version__}, triton {triton.__version__}; peak HBM {peak_bandwidth() / 1e12:.2f} TB/s")
    pool = torch.randint(-2**62, 2**62, (16 * EXPERT_BYTES_1 // 8 * 2,), dtype=torch.int64, device="cuda")
    rows = []
    for experts in (1, 2, 4, 8) if shard == 0 and not opts.fused else ():
        for nbytes, what in ((experts * EXPERT_BYTES_1, "gate/up"), (experts * EXPERT_BYTES_2, "down")):
            best = min((stream_us(nbytes, pool, *c), *c) for c in STREAM_CONFIGS)
            print(f"stream {experts} experts' {what} ({nbytes / 1e6:.1f} MB): {best[0]:.1f} us, "
                  f"{nbytes / best[0] / 1e6:.2f} TB/s (block {best[1]}, steps {best[2]}, warps {best[3]})", flush=True)
            rows.append(dict(kind="stream", experts=experts, what=what, bytes=nbytes, us=best[0]))
    del pool
    sweep(fp8_decode.moe_fp8_decode, itertools.islice(configs(opts.fused), shard, None, shards), fp8_decode.CONFIGS,
          opts.seq_lens, deadline, rows)
    if opts.json:
        write_json(opts.json, rows)


if __name__ == "__main__":
    main()
