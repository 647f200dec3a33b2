"""`flashinfer_direct` for the gathered prefills (vLLM's convention, gdn_prefill_gathered_*): vLLM's
FlashInfer call without FlashInfer's Python layers, as kernels/library/gdn/flashinfer_direct.py
makes the contest prefill's.

The same guard and kernel call as `vllm_flashinfer_prefill.cp_off` (kernels/library/gdn/vllm.py:
cu_seqlens checked and alpha = exp(g) in one launch, the states read and written in place), with
the compiled kernel handed its views directly (kernels/library/gdn/flashinfer_compiled.py): q/k/v
split out of vLLM's projection row are read in place, where the dispatcher used to copy them
(`strided`). Where the store's eager rows say what FlashInfer's layers cost vLLM's call: a direct
call 60 us cheaper would have been the fastest eagerly on 81-103 of each head count's 139 measured
workloads (H200 rows, 2026-11-29).
"""
from __future__ import annotations

from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, gathered_prefill_name
from kdispatch.kernels.cuda.gdn import prefill_guard
from kdispatch.kernels.library.gdn import flashinfer_compiled
from kdispatch.kernels.library.gdn.flashinfer_direct import internals_ready
from kdispatch.registry import variant


def gdn_prefill_gathered_flashinfer_direct(q, k, v, g, beta, initial_state, cu_seqlens, out, scale):
    cu, _, alpha, _ = prefill_guard.guard(cu_seqlens, q.shape[0], log_decay=g, out=out, malformed="empty")
    scale = float(scale) if scale else q.shape[2] ** -0.5  # FlashInfer's default for 0 / None
    q, k, v = (x if flashinfer_compiled.takes(x) else x.contiguous() for x in (q, k, v))
    flashinfer_compiled.call(out, initial_state, q, k, v, alpha, beta, cu, scale)
    return out, initial_state


for _hq, _hv in GATHERED_HEADS.values():
    variant(gathered_prefill_name(_hq, _hv), "flashinfer_direct", backend="library", archs=("sm90",),
            requires=("flashinfer", "cuda.core", "cutlass"), strided=True,
            ready=internals_ready)(gdn_prefill_gathered_flashinfer_direct)
