"""The launches of one op call, keyed once per call instead of once per launch.

`launch` (launch.py) keys each launch by the specialisation of its arguments, computed from them
every time: on the GPU machine's host (benchmarks/moe_host_parts.py, results/moe-host-parts-H200.txt)
that is ~14 us a launch beyond the ~7-10 us of Triton's launcher, and an op of four or five launches
pays it four or five times. An op whose launches follow from a few facts of the call (its shapes,
its inputs' dtypes and 16-byte alignments, its configuration: `call_key`) keys the whole call once:

    run = Launches((*call_key("my_op", x, out), n, BLOCK))
    run(kernel_a, grid_a, *args_a, num_warps=4)
    run(kernel_b, grid_b, *args_b)

The n-th launch of a call reuses the kernel compiled for the n-th launch of the first call with the
same key and goes straight to its launcher; the first call's launches are JIT calls (they compile,
or find the kernel in Triton's caches). The key must therefore determine everything the JIT call
specialises on: every pointer's dtype and alignment, every int's value class (1, a multiple of 16,
int32 range), every constexpr, num_warps and num_stages; an op that keys by its shapes and
configuration and derives its ints and constexprs from them does. A call must launch the same
kernels in the same order as the first call with its key (checked: a different kernel raises).

As in launch.py, the JIT call stays in use under the interpreter (TRITON_INTERPRET=1, the CPU tests)
and while a launch hook is set (profilers such as proton).
"""
from __future__ import annotations

import torch
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from kdispatch.kernels.triton.launch import _hooked

# key -> [(kernel, compiled kernel)] by launch index. Keys hold sizes by value (an op sees many
# token counts), so the table is emptied when it grows past MAX_KEYS: recompiling is a JIT call each
# (Triton keeps the kernels), not a compile.
_CALLS: dict[tuple, list] = {}
MAX_KEYS = 4096


def call_key(site: str, *tensors: torch.Tensor) -> tuple:
    """The start of a call's key: the call site (the op and which of its launch sequences: two sites
    never share keys), the current CUDA device (None for CPU tensors: the interpreter), and for each
    tensor the facts the JIT specialises on, its dtype and whether its address is a multiple of 16
    bytes. The op adds its shapes and configuration."""
    device = driver.active.get_current_device() if tensors[0].is_cuda else None
    return (site, device, *[(t.dtype, t.data_ptr() & 15 == 0) for t in tensors])


class Launches:
    """The launches of one call whose key is `key` (see the module docstring)."""

    __slots__ = ("_done", "_n", "_stream")

    def __init__(self, key: tuple):
        done = _CALLS.get(key)
        if done is None:
            if len(_CALLS) >= MAX_KEYS:
                _CALLS.clear()
            done = _CALLS[key] = []
        self._done = done
        self._n = 0
        self._stream = None

    def __call__(self, kernel, grid: tuple[int, ...], *args, num_warps: int = 4, num_stages: int = 3,
                 launch_pdl: bool = False) -> None:
        """`launch_pdl`: a programmatic dependent launch (sm_90+): the kernel may start before the one
        before it ends, and must wait for it (`tl.extra.cuda.gdc_wait`) before reading what it wrote."""
        n = self._n
        if (not isinstance(kernel, JITFunction) or _hooked(knobs.runtime.launch_enter_hook)
                or _hooked(knobs.runtime.launch_exit_hook)):
            kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, launch_pdl=launch_pdl)
            return
        self._n = n + 1
        done = self._done
        if n >= len(done):  # the first call with this key: the JIT call, its compiled kernel kept
            compiled = kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, launch_pdl=launch_pdl)
            if n == len(done):
                done.append((kernel, compiled))
            return
        known, compiled = done[n]
        if known is not kernel:
            raise RuntimeError(f"Launches: launch {n} of a call is {kernel.__name__}, where the first call with "
                               f"this key launched {known.__name__}: the key misses what decides the launches")
        if self._stream is None:
            self._stream = driver.active.get_current_stream(driver.active.get_current_device())
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        # no launch metadata and no hooks: none is set; the compiled kernel's launcher holds launch_pdl
        compiled.run(grid[0], g1, g2, self._stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *args)
