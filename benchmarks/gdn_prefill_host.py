"""Where an eager GDN prefill call's time goes, host against device, for the library-backed variants
of the contest prefill and the bare library calls under them (issue 16: FlashQLA measured ~0.75 ms
per eager call from 1 to 8k tokens on the H100, 2026-11-27, fla-core's chunk ~2.6 ms: flat in the
size, so not kernel time).

For each shape (sequences x tokens) and call: the synchronised wall time of a call (median of 50,
device idle before each), its host time (until the call returns; a call that syncs inside includes
the device time before the sync), the device time of its kernels (torch.profiler, summed, the top
three named), and for the first shape the functions with the most own host time under cProfile. Also how tvm-ffi
hands torch tensors to TileLang's kernels (a C DLPack exchange, or a slow per-tensor `__dlpack__`).

    python benchmarks/gdn_prefill_host.py [--shapes 1x1 1x8192 1x32768] [--json out.json]
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import torch

from kdispatch import registry
from kdispatch.kernels.cuda.gdn import prefill_guard
from kdispatch.workloads import SimpleWorkload, materialize

from hosttime import host_breakdown, host_us, kernel_times  # noqa: E402  (benchmarks/ is the script folder)
from wrapper_overhead import bare_calls as library_calls  # noqa: E402

DEF = "gdn_prefill"
VARIANTS = ("flashinfer", "flashqla_chunk", "fla_chunk", "triton_prefill_chunked.v16")


def wall_us(fn, args, calls: int = 50) -> float:
    """Median microseconds from the call to the device being idle again, idle before each call."""
    fn(*args)
    samples = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(*args)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def bare_calls(args) -> dict:
    """name -> fn(*args): the libraries' own calls on inputs prepared outside the timed call (gates
    activated or passed as the library wants them, cu_seqlens int64, FlashQLA's log decay)."""
    q, k, v, state, A_log, a, dt_bias, b, cu, scale = args
    calls = {}
    for name in ("flashinfer", "fla_chunk"):  # benchmarks/wrapper_overhead.py's bare calls
        try:
            calls[f"{name} (bare)"] = library_calls()[(DEF, name)](args)
        except ImportError as e:
            print(f"{name}: {e}")
    try:
        from flash_qla import chunk_gated_delta_rule as qla

        cu64, _, alpha, beta = prefill_guard.guard(cu, q.shape[0], gates=(A_log, a, dt_bias, b))
        g = torch.log(alpha)
        for cp in (True, False):
            calls[f"flash_qla auto_cp={cp} (bare)"] = lambda *_, cp=cp: qla(
                q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=state,
                output_final_state=True, cu_seqlens=cu64, state_v_first=True, auto_cp=cp)
    except ImportError as e:
        print(f"flash_qla: {e}")
    return calls


def dlpack_path() -> str:
    try:
        import tvm_ffi  # noqa: F401  (importing it installs the exchange where it can)
    except ImportError as e:
        return f"tvm_ffi not importable: {e}"
    has = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    return f"tvm_ffi {tvm_ffi.__version__}: torch.Tensor.__dlpack_c_exchange_api__ {'set' if has else 'MISSING'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["1x1", "1x8192", "1x32768"],
                    help="sequences x total tokens")
    ap.add_argument("--json", type=Path)
    opts = ap.parse_args()
    registry.discover()
    print(f"# benchmarks/gdn_prefill_host.py on {torch.cuda.get_device_name()}, {datetime.date.today()}, "
          f"torch {torch.__version__}; {dlpack_path()}")
    rows = []
    for i, shape in enumerate(opts.shapes):
        n, t = map(int, shape.split("x"))
        axes = {"num_seqs": n, "total_seq_len": t}
        args = list(materialize(DEF, SimpleWorkload(axes, uuid=f"host-{shape}"), device="cuda", seed=0))
        calls = {name: registry.get(DEF, name).fn for name in VARIANTS
                 if registry.get(DEF, name).why_not("sm90") is None}
        calls.update(bare_calls(args))
        print(f"== {n} sequences, {t} tokens")
        for name, fn in calls.items():
            kernels = kernel_times(fn, args)
            row = {"shape": axes, "call": name, "wall_us": wall_us(fn, args), "host_us": host_us(fn, args),
                   "device_us": sum(kernels.values()),
                   "top_kernels": sorted(kernels.items(), key=lambda kv: -kv[1])[:3]}
            rows.append(row)
            top = ", ".join(f"{k[:40]} {us:.1f}" for k, us in row["top_kernels"])
            print(f"  {name:<32} wall {row['wall_us']:8.1f}  host {row['host_us']:8.1f}  "
                  f"device {row['device_us']:8.1f} us  ({len(kernels)} kernels; top: {top})", flush=True)
            if i == 0 and "flash" in name:
                print("\n".join(f"      {line}" for line in host_breakdown(fn, args)))
    if opts.json:
        opts.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "date": str(datetime.date.today()),
                                         "dlpack": dlpack_path(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
