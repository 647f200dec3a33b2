"""`flashinfer_direct` for the gathered prefills (vLLM's convention, gdn_prefill_gathered_*): vLLM's
FlashInfer call without FlashInfer's Python layers, as kernels/library/gdn/flashinfer_direct.py
makes the contest prefill's.

The same guard and kernel call as `vllm_flashinfer_prefill.cp_off` (kernels/library/gdn/vllm.py:
cu_seqlens checked and alpha = exp(g) in one launch, the states read and written in place), with
the compiled kernel handed its views directly. The kernel's configuration (bf16 q/k/v, activated
gates, fp32 states in place, int64 boundaries; head counts are arguments) is the contest prefill's,
so the look-up, the compile cache and the readiness probe are flashinfer_direct.py's. Where the
store's eager rows say what FlashInfer's layers cost vLLM's call: a direct call 60 us cheaper would
have been the fastest eagerly on 81-103 of each head count's 139 measured workloads (H200 rows,
2026-11-29). `call` is the part the contest variant repeats inline (its rows were measured with
that file as it is; it moves here when they are measured again).
"""
from __future__ import annotations

import importlib

from kdispatch import nvrtc
from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, gathered_prefill_name
from kdispatch.kernels.cuda.gdn import prefill_guard
from kdispatch.kernels.library.gdn import flashinfer_direct as direct
from kdispatch.registry import variant


def call(out, state, q, k, v, alpha, beta, cu, scale: float) -> None:
    """FlashInfer's sm_90 prefill kernel on contiguous operands (the entry's arguments): through the
    entry on a device's first call (it compiles or loads the kernel), the compiled kernel after."""
    import cuda.bindings.driver as driver

    index = q.device.index
    found = direct._compiled.get(index, False)
    if not found:
        importlib.import_module(direct._SM90).delta_rule_prefill_dsl_sm90(out, state, q, k, v, state, alpha, beta, cu,
                                                                           scale)
        if found is False:
            direct._compiled[index] = direct._lookup(q.device)
        return
    compiled, tensormaps = found
    T, hq, D = q.shape
    hk, hv, n = k.shape[1], v.shape[1], cu.shape[0] - 1
    hsab = max(hq, hv)
    # the entry's views: q token-major, k/v/out feature-major, one 3-D box per head
    compiled(q.as_strided((T, D, hq), (hq * D, 1, D)), k.as_strided((D, T, hk), (1, hk * D, D)),
             v.as_strided((D, T, hv), (1, hv * D, D)), out.as_strided((D, T, hv), (1, hv * D, D)),
             alpha.reshape(-1), beta.reshape(-1), state, state, None, None, None, tensormaps, cu, scale,
             hq, hk, hv, hsab, n, 1, 0, n * hsab, driver.CUstream(nvrtc.current_stream(index)))


def gdn_prefill_gathered_flashinfer_direct(q, k, v, g, beta, initial_state, cu_seqlens, out, scale):
    cu, _, alpha, _ = prefill_guard.guard(cu_seqlens, q.shape[0], log_decay=g, out=out, malformed="empty")
    scale = float(scale) if scale else q.shape[2] ** -0.5  # FlashInfer's default for 0 / None
    call(out, initial_state, q.contiguous(), k.contiguous(), v.contiguous(), alpha, beta, cu, scale)
    return out, initial_state


for _hq, _hv in GATHERED_HEADS.values():
    variant(gathered_prefill_name(_hq, _hv), "flashinfer_direct", backend="library", archs=("sm90",),
            requires=("flashinfer", "cuda.core", "cutlass"),
            ready=direct.internals_ready)(gdn_prefill_gathered_flashinfer_direct)
