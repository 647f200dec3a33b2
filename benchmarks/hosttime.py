"""Host and device time of a call, for the benchmarks that report them: the time until the call returns
with the device idle (synchronised before each call, outside the timed window), where that time goes
(the functions with the most own time under cProfile, which inflates small Python calls), and the
device time of each kernel it launches (torch.profiler)."""
from __future__ import annotations

import cProfile
import collections
import datetime
import json
import pstats
import statistics
import time
from pathlib import Path

import torch

PROFILED = 20  # calls under cProfile
CALLS = 20  # calls under torch.profiler


def host_us(fn, args, *, until_idle: bool = False) -> float:
    """Median host microseconds until `fn(*args)` returns, with an idle device (synchronised before each
    call), over 100 calls after 10 unmeasured; with `until_idle`, until the device is idle again too
    (host + device of a synchronised call, what the tuner's eager time measures)."""
    samples = []
    for _ in range(10):
        fn(*args)
    for _ in range(100):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*args)
        if until_idle:
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def host_breakdown(fn, args, top: int = 12) -> list[str]:
    """The functions with the most own host time per call under cProfile (which inflates small calls)."""
    prof = cProfile.Profile()
    for _ in range(PROFILED):
        torch.cuda.synchronize()
        prof.enable()
        fn(*args)
        prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    rows = sorted(((tt, nc, f, callers) for f, (_cc, nc, tt, _ct, callers) in stats.items()), reverse=True)[:top]
    return [f"{tt / PROFILED * 1e6:8.1f} us  {nc // PROFILED:3d} calls  {_where(f)}  <- {_top_caller(callers)}"
            for tt, nc, f, callers in rows]


def _where(f) -> str:
    return f"{f[2]} ({f[0].split('/')[-1]}:{f[1]})"


def _top_caller(callers: dict) -> str:
    """The caller that made the most of a function's calls (what a hot library function is called for)."""
    if not callers:
        return "-"
    return _where(max(callers, key=lambda c: callers[c][0]))


def kernel_times(fn, args) -> dict[str, float]:
    """Device microseconds per call of each kernel `fn(*args)` launches (mean over CALLS calls)."""
    fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn(*args)
        torch.cuda.synchronize()
    per = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name] += e.time_range.elapsed_us() / CALLS
    return dict(per)


def write_rows(path, rows: list) -> None:
    """A host-time benchmark's rows as JSON, with the device, date and torch version they were taken on."""
    Path(path).write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                                      "torch": torch.__version__, "rows": rows}, indent=1))
