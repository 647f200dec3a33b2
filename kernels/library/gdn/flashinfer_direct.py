"""FlashInfer's sm_90 GDN prefill kernel called without the Python layers above it: a variant of the
contest prefill for eager calls, where those layers are most of the time.

FlashInfer's `chunk_gated_delta_rule` (without its context-parallel path) reaches a CuTe-DSL kernel
compiled once per configuration and called through tvm-ffi; on the H200 host an eager call spent
46-76 us of host time there, of which the compiled call took 23-37 (2026-11-29,
`benchmarks/flashinfer_prefill_host.py`). This variant makes the same kernel call as
`flashinfer.cp_off` (kernels/library/gdn/flashinfer.py: same guard, same inputs, same results) but
hands the compiled kernel its views directly. The first call of a process goes through FlashInfer's
sm_90 entry, which compiles or loads the kernel; later calls find it in FlashInfer's compile cache
under the configuration the entry would look up. Where that look-up finds nothing (another
FlashInfer's internals), every call keeps going through the entry, said once.

The readiness probe checks that the installed FlashInfer has the internals this reads.
"""
from __future__ import annotations

import importlib
import warnings

import torch

from kdispatch import nvrtc
from kdispatch.kernels.cuda.gdn import prefill_guard
from kdispatch.registry import variant

_SM90 = "flashinfer.gdn_kernels.delta_rule_dsl.delta_rule_sm90"
_INTERNALS = ("delta_rule_prefill_dsl_sm90", "_get_prefill_kernel", "get_cached_compile", "_SM90_COMPILE_OPTIONS",
              "_get_cache_buf", "get_device_sm_count")
_compiled: dict[int, object] = {}  # device index -> the compiled kernel, or None: keep to the entry


def internals_ready() -> str | None:
    """None when FlashInfer's sm_90 prefill module has what this variant calls, else why not."""
    try:
        sm90 = importlib.import_module(_SM90)
    except ImportError as exc:
        return f"FlashInfer's sm_90 GDN prefill module does not import: {exc}"
    absent = [n for n in _INTERNALS if not hasattr(sm90, n)]
    return f"{_SM90} lacks {', '.join(absent)} (another FlashInfer version)" if absent else None


def _lookup(device: torch.device):
    """The compiled kernel the entry has just used for a bf16 batch with fp32 states read and written
    in place, activated gates and int64 boundaries; None (said once) where the cache holds none."""
    import cutlass

    sm90 = importlib.import_module(_SM90)
    kernel = sm90._get_prefill_kernel(True, True, True, False, cutlass.BFloat16, initial_state_dtype=torch.float32,
                                      state_dtype=torch.float32, checkpoint_state_dtype=torch.float32,
                                      use_state_indices=False, cu_seqlens_dtype=torch.int64,
                                      state_indices_dtype=None, checkpoint_cu_starts_dtype=None,
                                      state_inner_strides=None, init_state_inner_strides=None)
    compiled = sm90.get_cached_compile(kernel, sm90._SM90_COMPILE_OPTIONS)
    if compiled is None:
        warnings.warn("flashinfer_direct: FlashInfer's compile cache has no kernel under the configuration "
                      "looked up; every call goes through FlashInfer's sm_90 entry", RuntimeWarning, stacklevel=3)
        return None
    tensormaps = sm90._get_cache_buf("gdn_prefill_tensormaps", sm90.get_device_sm_count(device) * 128, device)
    return compiled, tensormaps


def gdn_prefill_flashinfer_direct(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    import cuda.bindings.driver as driver

    T, hq, D = q.shape
    hk, hv = k.shape[1], v.shape[1]
    out = torch.empty(T, hv, D, dtype=q.dtype, device=q.device)
    cu, _, alpha, beta = prefill_guard.guard(cu_seqlens, T, gates=(A_log, a, dt_bias, b), out=out,
                                             malformed="empty")
    scale = float(scale) if scale else D ** -0.5  # the definition's 0 / None: 1/sqrt(head size)
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    found = _compiled.get(index, False)
    if not found:  # the first call on this device compiles or loads the kernel through the entry
        importlib.import_module(_SM90).delta_rule_prefill_dsl_sm90(out, state, q, k, v, state, alpha, beta, cu,
                                                                    scale)
        if found is False:
            _compiled[index] = _lookup(q.device)
        return out, state
    compiled, tensormaps = found
    n, hsab = cu.shape[0] - 1, max(hq, hv)
    # the entry's views: q token-major, k/v/out feature-major, one 3-D box per head
    compiled(q.as_strided((T, D, hq), (hq * D, 1, D)), k.as_strided((D, T, hk), (1, hk * D, D)),
             v.as_strided((D, T, hv), (1, hv * D, D)), out.as_strided((D, T, hv), (1, hv * D, D)),
             alpha.reshape(-1), beta.reshape(-1), state, state, None, None, None, tensormaps, cu, scale,
             hq, hk, hv, hsab, n, 1, 0, n * hsab, driver.CUstream(nvrtc.current_stream(index)))
    return out, state


variant("gdn_prefill", "flashinfer_direct", backend="library", archs=("sm90",),
        requires=("flashinfer", "cuda.core", "cutlass"), ready=internals_ready)(gdn_prefill_flashinfer_direct)
