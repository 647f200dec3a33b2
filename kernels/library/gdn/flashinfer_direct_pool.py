"""`flashinfer_direct` for the pool prefills (SGLang's convention, gdn_prefill_pool_*): the pool
variant `flashinfer_pool_inplace.cp_off` (kernels/library/gdn/flashinfer_pool.py: the same prepare
launch, FlashInfer's kernel reading and writing pool rows through the slots) with the compiled
kernel handed its views directly (kernels/library/gdn/flashinfer_compiled.py), without FlashInfer's
Python layers. The kernel is compiled for the pool's inner strides: a pool viewed with other strides
is another configuration, compiled or loaded on its first call.
"""
from __future__ import annotations

from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.kernels.cuda.gdn import pool_prefill_prepare
from kdispatch.kernels.library.gdn import flashinfer_compiled
from kdispatch.kernels.library.gdn.flashinfer_direct import internals_ready
from kdispatch.registry import variant


def gdn_prefill_pool_flashinfer_direct(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens,
                                       out, scale):
    q, k, v, alpha, beta, cu, slots = pool_prefill_prepare.prepare(q, k, v, g, beta, state_pool, state_indices,
                                                                    has_initial_state, cu_seqlens, out)
    if q.shape[0] and slots.shape[0]:  # no sequences: nothing to launch; no tokens: only fresh rows, zeroed
        scale = float(scale) if scale else q.shape[2] ** -0.5  # FlashInfer's default for 0 / None
        flashinfer_compiled.call(out, state_pool, q, k, v, alpha, beta, cu, scale, slots)
    return out, state_pool


for _hq, _hv in PACKED_HEADS.values():
    variant(pool_prefill_name(_hq, _hv), "flashinfer_direct", backend="library", archs=("sm90",),
            requires=("flashinfer", "cuda.core", "cutlass"), strided=True,
            ready=internals_ready)(gdn_prefill_pool_flashinfer_direct)
