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
# kernel -> (is constexpr, specialised) per parameter; None for an interpreted kernel
_SLOTS: dict[object, tuple[tuple[bool, bool], ...] | None] = {}


def _slots(kernel) -> tuple[tuple[bool, bool], ...] | None:
    if kernel not in _SLOTS:
        _SLOTS[kernel] = (tuple((p.is_constexpr, not p.do_not_specialize) for p in kernel.params)
                          if isinstance(kernel, JITFunction) else None)
    return _SLOTS[kernel]


def _specialisation(args, slots) -> tuple:
    """What the JIT call keys a compiled kernel by, for these arguments (the launch options aside)."""
    key = []
    for a, (constexpr, specialised) in zip(args, slots):
        if constexpr:
            key.append(a)
        elif isinstance(a, torch.Tensor):
            key.append((a.dtype, a.data_ptr() & 15 == 0))
        elif isinstance(a, bool) or a is None:
            key.append(a)
        elif isinstance(a, int):
            wide = not -_INT32 <= a < _INT32
            key.append((wide, a == 1, a & 15 == 0) if specialised else wide)
        elif isinstance(a, float):
            key.append(float)
        else:  # anything else (tuples, descriptors) is not handled here
            raise TypeError(f"launch: argument of type {type(a).__name__}")
    return tuple(key)


def launch(kernel, grid: tuple[int, ...], *args, num_warps: int = 4, num_stages: int = 3) -> None:
    """`kernel[grid](*args, num_warps=..., num_stages=...)`, for less host time once compiled."""
    slots = _slots(kernel)
    if slots is None or knobs.runtime.launch_enter_hook is not None or knobs.runtime.launch_exit_hook is not None:
        kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
        return
    if len(args) != len(slots):
        raise TypeError(f"launch: {kernel.__name__} takes {len(slots)} arguments, got {len(args)}")
    device = driver.active.get_current_device()
    key = (kernel, device, num_warps, num_stages, _specialisation(args, slots))
    compiled = _COMPILED.get(key)
    if compiled is None:
        _COMPILED[key] = kernel[grid](*args, num_warps=num_warps, num_stages=num_stages)
        return
    stream = driver.active.get_current_stream(device)
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    compiled.run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *args)

