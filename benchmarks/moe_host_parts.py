"""Where a moe_fp8 call's host time goes, piece by piece, on this machine: each piece timed alone in a
loop (host microseconds per call, the minimum over repeats of the mean of a batch), then whole calls
(in a loop, after a sync as the tuner's eager mode starts them, and with every kernel launch replaced
by nothing: the Python around the launches). cProfile (benchmarks/moe_profile.py --host) inflates
small calls; this does not, but it cannot see inside one call.

    python benchmarks/moe_host_parts.py [--seq-lens 1 32 512] [--variants triton_decode.n128s4q ...]
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import statistics
import time

import torch

from kdispatch import registry
from kdispatch.workloads import SimpleWorkload, materialize

DEF = "moe_fp8"
BATCH = 200  # calls per timed batch
REPEATS = 5


def per_call_us(fn, batch: int = BATCH, repeats: int = REPEATS) -> float:
    """Host microseconds per `fn()`: the least mean over `repeats` batches (no sync inside a batch)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        best = min(best, (time.perf_counter() - t0) / batch * 1e6)
        torch.cuda.synchronize()
    return best


def after_sync_us(fn, calls: int = 100) -> tuple[float, float]:
    """(Median host microseconds until `fn()` returns after a sync; median until the device is idle
    again: the tuner's eager time)."""
    host, wall = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e6)
        wall.append((t2 - t0) * 1e6)
    return statistics.median(host), statistics.median(wall)


@contextlib.contextmanager
def no_launches():
    """Every launch through kernels/triton/launches.py (the MoE Triton kernels') replaced by nothing:
    what is left is the Python around them."""
    from kdispatch.kernels.triton.launches import Launches
    saved = Launches.__call__
    Launches.__call__ = lambda self, *a, **k: None
    try:
        yield
    finally:
        Launches.__call__ = saved


def pieces() -> list[tuple[str, float]]:
    """The building blocks one at a time."""
    import triton
    import triton.language as tl
    from triton.runtime.driver import driver

    from kdispatch.kernels.triton.launch import _specialisation, launch
    from kdispatch.kernels.triton.launches import Launches, call_key

    @triton.jit
    def twenty_args(p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, i0, i1, i2, f0, f1,
                    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, C4: tl.constexpr):
        tl.store(p0 + tl.program_id(0), i0 + C0)

    def empty():
        return torch.empty(1 << 20, dtype=torch.float32, device="cuda")
    t = [empty() for _ in range(10)]
    args = (*t, 3, 64, 7, 1.5, 0.5, 1, 2, 3, 4, 5)
    twenty_args[(1,)](*args)
    torch.cuda.synchronize()
    compiled = twenty_args[(1,)](*args)  # the JIT call returns the compiled kernel
    stream = driver.active.get_current_stream(0)
    rows = [
        ("sync round trip (idle device)", per_call_us(torch.cuda.synchronize)),
        ("torch.empty 4 MiB", per_call_us(empty)),
        ("torch.zeros 64 int32", per_call_us(lambda: torch.zeros(64, dtype=torch.int32, device="cuda"))),
        ("tensor.contiguous() (already)", per_call_us(lambda: t[0].contiguous())),
        ("fp32 -> bf16 .to() of 7168 (a kernel)", per_call_us(lambda: t[1][:7168].to(torch.bfloat16))),
        ("driver current device + stream", per_call_us(
            lambda: driver.active.get_current_stream(driver.active.get_current_device()))),
        ("launch._specialisation, 15 runtime args", per_call_us(lambda: _specialisation(args[:15], (True,) * 15))),
        ("JIT call kernel[grid](20 args)", per_call_us(lambda: twenty_args[(1,)](*args))),
        ("launch(kernel, grid, 20 args)", per_call_us(lambda: launch(twenty_args, (1,), *args, num_warps=4))),
        ("launches.call_key(10 tensors)", per_call_us(lambda: call_key("parts", *t))),
        ("Launches(key) + one launch of 20 args", per_call_us(
            lambda: Launches(("parts",))(twenty_args, (1,), *args, num_warps=4))),
        ("compiled.run(20 args), the launcher alone", per_call_us(
            lambda: compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None,
                                 *args))),
    ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1, 32, 512])
    ap.add_argument("--variants", nargs="+", default=["triton_decode.n128s4q", "triton_grouped_m16.fr",
                                                       "triton_grouped_m32q.fr"])
    opts = ap.parse_args()
    registry.discover()
    import triton

    import kdispatch
    print(f"# benchmarks/moe_host_parts.py on {torch.cuda.get_device_name()}, {datetime.date.today()}, torch "
          f"{torch.__version__}, triton {triton.__version__}")
    for name, us in pieces():
        print(f"  {us:8.2f} us  {name}", flush=True)
    for seq_len in opts.seq_lens:
        axes = {"seq_len": seq_len}
        args = list(materialize(DEF, SimpleWorkload(axes, uuid=f"host-{seq_len}"), device="cuda", seed=0))
        print(f"== seq_len {seq_len}", flush=True)
        calls = [(name, registry.get(DEF, name)) for name in opts.variants]
        calls = [(name, v.fn) for name, v in calls if v.declines(axes) is None]
        calls.append(("routed op kdispatch.ops.moe_fp8", kdispatch.ops.moe_fp8))
        for name, fn in calls:
            fn(*args)
            torch.cuda.synchronize()
            host, wall = after_sync_us(lambda: fn(*args))
            looped = per_call_us(lambda: fn(*args), batch=20)
            line = f"  {name}: after a sync host {host:.1f} us, eager (host + device) {wall:.1f}; " \
                   f"in a loop {looped:.1f}"
            if not name.startswith("routed"):
                with no_launches():
                    line += f"; without launches {per_call_us(lambda: fn(*args), batch=50):.1f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
