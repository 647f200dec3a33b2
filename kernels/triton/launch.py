"""Launching Triton kernels for less host time than their JIT call.

A JIT call (`kernel[grid](...)`) binds its arguments, builds a string key from their specialisation
(dtype and 16-byte alignment of each pointer, ints equal to 1 or divisible by 16, the constexpr
values), looks the compiled kernel up, checks the globals it read and builds launch metadata, every
call: on the GPU machine's host (benchmarks/moe_profile.py --host) about 20 us of a MoE call's
host time per launch, where the launch itself is a few. `launch(kernel, grid, *args)` keys the
compiled kernel by the same specialisation, computed directly from the arguments, and calls its
launcher; a specialisation not yet seen goes through the JIT call, which compiles it (or finds it in
Triton's caches) and is kept. Arguments are positional in the kernel's order, constexprs included.

The JIT call stays in use where the shortcut would skip something: under the interpreter
(TRITON_INTERPRET=1, the CPU tests) and while a launch hook is set (profilers such as proton).
"""
from __future__ import annotations

import torch
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

_INT32 = 2**31
_COMPILED: dict[tuple, object] = {}  # (kernel, device, options, specialisation) -> CompiledKernel
# kernel -> (number of runtime parameters, whether each is specialised); None: always the JIT call
# (an interpreted kernel, or constexprs before runtime parameters: the key takes the constexprs as
# the tail of the arguments)
_PLANS: dict[object, tuple[int, tuple[bool, ...]] | None] = {}


def _plan(kernel) -> tuple[int, tuple[bool, ...]] | None:
    if kernel not in _PLANS:
        plan = None
        if isinstance(kernel, JITFunction):
            constexpr = [p.is_constexpr for p in kernel.params]
            runtime = constexpr.index(True) if True in constexpr else len(constexpr)
            if all(constexpr[runtime:]):
                plan = (runtime, tuple(not p.do_not_specialize for p in kernel.params[:runtime]))
        _PLANS[kernel] = plan
    return _PLANS[kernel]


def _hooked(hook) -> bool:
    """Whether a launch hook is set: None or an empty HookChain (Triton >= 3.5's default) is not."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _specialisation(args, specialised) -> tuple:
    """What the JIT call keys a compiled kernel by, for these runtime arguments (tensors, ints, floats,
    bools, None): each pointer's dtype and 16-byte alignment, each int's width and, where specialised,
    whether it is 1 or divides by 16; floats by type, anything else by value."""
    return tuple([(a.dtype, a.data_ptr() & 15 == 0) if isinstance(a, torch.Tensor)
                  else (float if type(a) is float else a) if type(a) is not int
                  else (a == 1, a & 15 == 0, -_INT32 <= a < _INT32) if s else -_INT32 <= a < _INT32
                  for a, s in zip(args, specialised)])


def launch(kernel, grid: tuple[int, ...], *args, num_warps: int = 4, num_stages: int = 3) -> None:
    """`kernel[grid](*args, num_warps=..., num_stages=...)`, for less host time once compiled."""
    plan = _plan(kernel)
    if plan is None or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
        kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
        return
    runtime, specialised = plan
    if len(args) != len(kernel.params):
        raise TypeError(f"launch: {kernel.__name__} takes {len(kernel.params)} arguments, got {len(args)}")
    device = driver.active.get_current_device()
    key = (kernel, device, num_warps, num_stages, args[runtime:], _specialisation(args[:runtime], specialised))
    compiled = _COMPILED.get(key)
    if compiled is None:
        _COMPILED[key] = kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
        return
    stream = driver.active.get_current_stream(device)
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    # no launch metadata and no hooks: none is set
    compiled.run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *args)
