"""Where a moe_fp8 call's time goes, kernel by kernel, at decode batch sizes: each variant's kernels
(device time per call from torch.profiler over eager calls, after warm-up) beside the call's CUDA-graph
time (kdispatch.tuner.timing, inputs rotated past the L2) and the floor (benchmarks/floors.py: the
FP8 weight bytes of the experts the batch hits at peak HBM bandwidth). What the decode path of the
MoE issue has to remove, measured rather than guessed; each call's eager time too (single synchronised
calls, as the tuner times the eager mode). With --host, also the host time of a call (the
time until it returns, the device synchronised outside the timed window) and where it goes: the
functions with the most own time under cProfile, for each variant and the routed op
(benchmarks/moe_host_parts.py times the pieces without cProfile's inflation).

    python benchmarks/moe_profile.py [--seq-lens 1 8 32 64] [--variants triton_grouped_m16.fr ...] [--host]
"""
from __future__ import annotations

import argparse
import datetime
import statistics

import torch

from kdispatch import registry
from kdispatch.tuner import timing
from kdispatch.workloads import SimpleWorkload, materialize

from floors import floor_us  # noqa: E402  (benchmarks/ is the script folder)
from hosttime import host_breakdown, host_us, kernel_times  # noqa: E402

DEF = "moe_fp8"
EAGER_CALLS = 50  # single synchronised calls (timing.eager_times_us: host + device, what the tuner times eagerly)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--variants", nargs="+", default=["triton_decode.n64s4q", "triton_decode.n64s4qc",
                                                       "triton_decode.n128s8q", "triton_decode.n128s8qc",
                                                       "triton_grouped_m16.fr", "triton_grouped_m32q.fr",
                                                       "sglang_triton_moe"])
    ap.add_argument("--host", action="store_true", help="host time per call and its cProfile breakdown")
    ap.add_argument("--label", default="", help="said in the header (e.g. which kernels' sources were measured)")
    opts = ap.parse_args()
    registry.discover()
    import triton

    print(f"# benchmarks/moe_profile.py on {torch.cuda.get_device_name()}, {datetime.date.today()}, torch "
          f"{torch.__version__}, triton {triton.__version__}{', ' + opts.label if opts.label else ''}")
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    for seq_len in opts.seq_lens:
        axes = {"seq_len": seq_len}
        args = list(materialize(DEF, SimpleWorkload(axes, uuid=f"profile-{seq_len}"), device="cuda", seed=0))
        sets = timing.input_sets(DEF, args, l2, max_sets=8)
        print(f"== seq_len {seq_len}: floor {floor_us(DEF, args, axes):.1f} us", flush=True)
        for name in opts.variants:
            v = registry.get(DEF, name)
            why = v.why_not("sm90") or v.declines(axes)
            if why is not None:
                print(f"  {name}: not run ({why})")
                continue
            try:
                graph_us = statistics.median(timing.graph_times_us(v.fn, sets, 3)[0])
            except Exception as exc:  # an eager-only variant (deepgemm_contiguous reads its row count back)
                graph_us, graph = None, f"no graph ({type(exc).__name__})"
            v.fn(*args)  # compiled (warmed up) before the eager calls are timed
            eager = statistics.median(timing.eager_times_us(v.fn, sets, EAGER_CALLS))
            if graph_us is None:
                graph += f", eager {eager:.1f} us per call"
            else:
                graph = f"graph {graph_us:.1f} us per call, eager {eager:.1f} (eager - graph {eager - graph_us:.1f})"
            kernels = kernel_times(v.fn, args)
            print(f"  {name}: {graph}; kernels {sum(kernels.values()):.1f} us of device time")
            for kname, us in sorted(kernels.items(), key=lambda kv: -kv[1]):
                print(f"    {us:8.1f} us  {kname[:110]}")
            if opts.host:
                print(f"  {name}: host {host_us(v.fn, args):.1f} us per call; own time under cProfile:")
                print("\n".join(f"    {line}" for line in host_breakdown(v.fn, args)))
        if opts.host:
            import kdispatch

            routed = kdispatch.ops.DISPATCHERS[DEF].choose("sm90", axes, mode="eager").name
            kdispatch.ops.moe_fp8(*args)
            eager = statistics.median(timing.eager_times_us(kdispatch.ops.moe_fp8, sets, EAGER_CALLS))
            print(f"  routed op (-> {routed}): eager {eager:.1f} us per call, host "
                  f"{host_us(kdispatch.ops.moe_fp8, args):.1f} us per call; own time:")
            print("\n".join(f"    {line}" for line in host_breakdown(kdispatch.ops.moe_fp8, args)))


if __name__ == "__main__":
    main()
