"""FlashInfer's compiled sm_90 GDN prefill kernel called without FlashInfer's Python layers, for the
engine-convention prefills' `flashinfer_direct` variants: states gathered per sequence (vLLM's
convention) or rows of a state pool named by slot indices (SGLang's).

FlashInfer's sm_90 entry compiles one kernel per configuration (input dtype, state dtypes, boundary
and slot dtypes, a pool's inner strides) and keeps it in its compile cache; the host time of an eager
call is mostly the layers between the public call and that kernel (kernels/library/gdn/
flashinfer_direct.py, the contest prefill's variant, has the figures). The first call of a process
with a configuration goes through the entry (it compiles or loads the kernel); later ones hand the
compiled kernel the entry's views directly. A configuration the cache does not hold keeps its calls
on the entry, said once. The contest variant's own copy of this look-up moves here when its rows are
measured again (its rows were taken with that file as it is).
"""
from __future__ import annotations

import importlib
import warnings

import torch

from kdispatch import nvrtc
from kdispatch.kernels.library.gdn.flashinfer_direct import _SM90

# (device index, boundary dtype, slot dtype, pool inner strides) -> (compiled kernel, tensormaps), or
# None: that configuration keeps to the entry
_compiled: dict[tuple, object] = {}


def _lookup(device: torch.device, cu_dtype: torch.dtype, slots: torch.Tensor | None, state: torch.Tensor):
    """The compiled kernel the entry has just used for bf16 q/k/v, activated gates and fp32 states
    read and written in place (through `slots` where given); None (said once) where the cache holds none."""
    import cutlass

    sm90 = importlib.import_module(_SM90)
    inner = tuple(state.stride()[1:]) if slots is not None else None
    kernel = sm90._get_prefill_kernel(True, True, True, False, cutlass.BFloat16, initial_state_dtype=torch.float32,
                                      state_dtype=torch.float32, checkpoint_state_dtype=torch.float32,
                                      use_state_indices=slots is not None, cu_seqlens_dtype=cu_dtype,
                                      state_indices_dtype=None if slots is None else slots.dtype,
                                      checkpoint_cu_starts_dtype=None, state_inner_strides=inner,
                                      init_state_inner_strides=inner)
    compiled = sm90.get_cached_compile(kernel, sm90._SM90_COMPILE_OPTIONS)
    if compiled is None:
        warnings.warn("flashinfer_direct: FlashInfer's compile cache has no kernel under the configuration "
                      "looked up; these calls go through FlashInfer's sm_90 entry", RuntimeWarning, stacklevel=3)
        return None
    tensormaps = sm90._get_cache_buf("gdn_prefill_tensormaps", sm90.get_device_sm_count(device) * 128, device)
    return compiled, tensormaps


def takes(x: torch.Tensor) -> bool:
    """Does the compiled kernel read q/k/v `x` [T, H, 128] as it is: heads and elements compact, a
    token stride of whole heads, 16-byte aligned? Views into an engine's projection row are (vLLM's
    q/k/v split out of mixed_qkv, the layout checked on the GPU); others need a contiguous copy."""
    return (x.stride(2) == 1 and x.stride(1) == x.shape[2] and x.stride(0) % x.shape[2] == 0
            and x.data_ptr() % 16 == 0)


def call(out, state, q, k, v, alpha, beta, cu, scale: float, slots: torch.Tensor | None = None) -> None:
    """The kernel on q/k/v that it `takes` and a contiguous out, at least one sequence: `state` holds
    each sequence's initial state and receives its final one, row i, or row slots[i] of a pool. The
    compiled kernel reads views of an engine's row in place (outputs and states bitwise equal to a
    contiguous copy's: H200, 2026-11-30); the entry, a process's first call of a configuration, gets
    contiguous ones."""
    import cuda.bindings.driver as driver

    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    key = (index, cu.dtype) if slots is None else (index, cu.dtype, slots.dtype, state.stride()[1:])
    found = _compiled.get(key, False)
    if not found:
        importlib.import_module(_SM90).delta_rule_prefill_dsl_sm90(out, state, q.contiguous(), k.contiguous(),
                                                                   v.contiguous(), state, alpha, beta, cu, scale,
                                                                   state_indices=slots)
        if found is False:
            _compiled[key] = _lookup(q.device, cu.dtype, slots, state)
        return
    compiled, tensormaps = found
    T, hq, D = q.shape
    hk, hv, n = k.shape[1], v.shape[1], cu.shape[0] - 1
    hsab = max(hq, hv)
    # the entry's views: q token-major, k/v/out feature-major, one 3-D box per head
    compiled(q.as_strided((T, D, hq), (q.stride(0), 1, D)), k.as_strided((D, T, hk), (1, k.stride(0), D)),
             v.as_strided((D, T, hv), (1, v.stride(0), D)), out.as_strided((D, T, hv), (1, hv * D, D)),
             alpha.reshape(-1), beta.reshape(-1), state, state, slots, None, None, tensormaps, cu, scale,
             hq, hk, hv, hsab, n, 1, 0, n * hsab, driver.CUstream(nvrtc.current_stream(index)))
