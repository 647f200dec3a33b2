"""Every Triton variant's kernels compiled for sm_90 on a machine without a GPU, through the variant's own
host code on small CPU inputs: the Triton front end, its sm_90 passes and ptxas run, nothing is launched.

What the interpreter (TRITON_INTERPRET=1, the CPU tests) never meets fails here before a GPU session
spends its time on it: a name that changes type inside a branch (2026-11-28: a reused `_` cost a GPU
call), an op the sm_90 lowering rejects, ptxas errors. How: a stand-in Triton driver names an sm_90
target, every JIT call compiles in warmup mode (so `kernels/triton/launch.py` takes the JIT call, a
launch hook is set), and a kernel's DOT_FP32 flag (set by the host code for CPU tensors, the
interpreter's fp32 dots) is forced off so that the tensor-core forms the GPU runs are the ones compiled.
The host code then goes on with outputs never written: only errors raised while compiling count.

    python tests/sm90_compile.py [--definitions SHORT ...] [--json OUT]

tests/test_sm90_compile.py runs it in a subprocess (the test session interprets its kernels). Not
covered: kernels launched only past a shape's first call, launch-time limits (shared memory per
block is checked when a compiled kernel is loaded), and anything that needs the real device.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime import driver
from triton.runtime.jit import JITFunction

# Small shapes of each definition whose variants include Triton ones (the engine conventions' kernels
# are the same for every head count: the largest is taken): a batch of one, where Triton specialises
# the integers equal to 1, and one more (MoE at 5 tokens reaches the decode and the grouped kernels).
SHAPES = {
    "gdn_decode": [{"batch_size": 1}, {"batch_size": 33}],
    "gdn_prefill": [{"total_seq_len": 1, "num_seqs": 1}, {"total_seq_len": 300, "num_seqs": 4}],
    "dsa_topk_indexer": [{"batch_size": 1, "max_num_pages": 40, "num_pages": 400},
                         {"batch_size": 2, "max_num_pages": 40, "num_pages": 400}],
    "dsa_sparse_attention": [{"num_tokens": 1, "num_pages": 200}, {"num_tokens": 8, "num_pages": 200}],
    "moe_fp8": [{"seq_len": 1}, {"seq_len": 5}],
    "gdn_decode_packed_qk16_v32": [{"batch_size": 1, "num_slots": 2}, {"batch_size": 37, "num_slots": 50}],
    "gdn_prefill_pool_qk16_v32": [{"total_seq_len": 1, "num_seqs": 1, "num_slots": 2},
                                  {"total_seq_len": 300, "num_seqs": 9, "num_slots": 12}],
    "gdn_prefill_gathered_qk16_v32": [{"total_seq_len": 1, "num_seqs": 1},
                                      {"total_seq_len": 300, "num_seqs": 9}],
}
SM90 = GPUTarget("cuda", 90, 32)


class OfflineSm90(DriverBase):
    """A Triton driver for compiling only: an sm_90 target, device 0, the null stream."""

    def is_active(self):
        return True

    def get_current_target(self):
        return SM90

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda

    def get_benchmarker(self):
        raise NotImplementedError("nothing runs here")

    def get_empty_cache_for_benchmark(self):
        raise NotImplementedError("nothing runs here")

    def clear_cache(self, cache):
        pass

    def map_python_to_cpp_type(self, ty):
        return ty


class _Compiles:
    """JITFunction.run replaced: compile in warmup mode with DOT_FP32 off, count the kernels, and tell a
    compile error from the host code's own errors."""

    def __init__(self):
        self.kernels: list[str] = []
        self.error: str | None = None
        self._run = JITFunction.run

    def __call__(self, fn, *args, grid, warmup, **kwargs):
        if "DOT_FP32" in fn.arg_names:
            i = fn.arg_names.index("DOT_FP32")
            if i < len(args):
                args = args[:i] + (False,) + args[i + 1:]
            else:
                kwargs["DOT_FP32"] = False
        try:
            kernel = self._run(fn, *args, grid=grid, warmup=True, **kwargs)
        except Exception as exc:
            self.error = f"{fn.__name__}: {type(exc).__name__}: {str(exc)[:1500]}"
            raise
        self.kernels.append(fn.__name__)
        return kernel


def install() -> _Compiles:
    """From here on in this process, Triton kernels compile for sm_90 and launch nothing."""
    if os.environ.get("TRITON_INTERPRET"):
        raise RuntimeError("unset TRITON_INTERPRET: kernels decorated under it are interpreted, not compiled")
    driver.set_active(OfflineSm90())
    compiles = _Compiles()
    JITFunction.run = lambda fn, *a, **k: compiles(fn, *a, **k)
    knobs.runtime.launch_enter_hook = lambda *_: None  # launch.py's shortcut steps aside for a hook
    return compiles


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--definitions", nargs="+", default=list(SHAPES))
    ap.add_argument("--json", help="write {variant: {kernels, compile_error, host_error}} here")
    opts = ap.parse_args()

    compiles = install()
    from kdispatch import definitions, registry
    from kdispatch.workloads import materialize

    registry.discover()
    results = {}
    for short, axes in ((s, a) for s in opts.definitions for a in SHAPES[s]):
        d = definitions.get(short)
        # what the spec calls shared is never written: passed as is, not copied per variant (cloning
        # MoE's 1.4 GB of weights for each of its 40 variant calls took ~30 s of the test)
        copied = [name not in d.spec.shared for name in d.inputs]
        variants = [v for v in registry.variants(short) if v.backend == "triton" and "sm90" in v.archs
                    and v.declines(axes) is None]
        if not variants:
            continue
        uuid = f"sm90-compile-{short}-{'-'.join(map(str, axes.values()))}"
        args = list(materialize(short, {"uuid": uuid, "axes": axes, "inputs": {}}, device="cpu"))
        for v in variants:
            compiles.kernels, compiles.error = [], None
            t0 = time.perf_counter()
            host_error = None
            try:
                v.fn(*[a.clone() if isinstance(a, torch.Tensor) and copy else a
                       for a, copy in zip(args, copied, strict=True)])
            except Exception as exc:
                if compiles.error is None:  # past the compiles: the host code on unwritten outputs
                    host_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            results[f"{short}/{v.name}/{axes}"] = {"kernels": sorted(set(compiles.kernels)),
                                                  "compile_error": compiles.error, "host_error": host_error}
            status = "COMPILE ERROR " + compiles.error if compiles.error else f"ok {len(set(compiles.kernels))} kernels"
            print(f"{short} {v.name} {axes}: {status} ({time.perf_counter() - t0:.1f} s)", flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if any(r["compile_error"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
