"""FlashInfer's chunked GDN prefill on the engines' state pool in place: a variant of the pool
prefills (gdn_prefill_pool_*). FlashInfer 0.7 reads and writes pool rows through `state_indices`
itself (`initial_state=pool, output_state=pool`), so the gather before and the scatter after that
SGLang 0.5.23 puts around the same kernel (the baseline, kernels/library/gdn/sglang.py: on 32 value
heads x 64 sequences, half a GB of state traffic) are not needed.

FlashInfer trusts what it is given (slots unchecked, no has_initial_state, no padding slot), so one
launch before it (kernels/cuda/gdn/pool_prefill_prepare.py) makes the definition's promises: q/k
normalised, gates in fp32, fresh rows zeroed, padding sequences emptied and their tokens neutral,
malformed boundaries turned into N empty sequences. FlashInfer's kernel neither reads nor writes
the state of an empty sequence, so the slot such a sequence gets (0) is never touched. Slots named
twice are the caller's precondition, as in the engines (KDISPATCH_CHECK=1 reports them).

A padding token's v must be finite: the token is neutral by k = 0 and beta = 0, and FlashInfer
multiplies v by beta.
"""
from __future__ import annotations

from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.kernels.cuda.gdn import pool_prefill_prepare
from kdispatch.registry import variant


def gdn_prefill_pool_flashinfer_inplace(q, k, v, g, beta, state_pool, state_indices, has_initial_state,
                                        cu_seqlens, out, scale, use_cp="auto"):
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    q, k, v, alpha, beta, cu, slots = pool_prefill_prepare.prepare(q, k, v, g, beta, state_pool, state_indices,
                                                                    has_initial_state, cu_seqlens, out)
    if q.shape[0] and slots.shape[0]:  # FlashInfer refuses zero sequences; no tokens leave only fresh rows
        chunk_gated_delta_rule(q, k, v, g=alpha, beta=beta, scale=scale, initial_state=state_pool,
                               output_final_state=True, cu_seqlens=cu, output=out, output_state=state_pool,
                               state_indices=slots, use_cp=use_cp)
    return out, state_pool


for _hq, _hv in PACKED_HEADS.values():
    _kw = dict(backend="library", archs=("sm90",), requires=("flashinfer", "cuda.core"), strided=True)
    variant(pool_prefill_name(_hq, _hv), "flashinfer_pool_inplace", **_kw)(gdn_prefill_pool_flashinfer_inplace)
    # without FlashInfer's context-parallel path (kernels/library/gdn/flashinfer.py says why)
    variant(pool_prefill_name(_hq, _hv), "flashinfer_pool_inplace", configs={"cp_off": {"use_cp": False}},
            **_kw)(gdn_prefill_pool_flashinfer_inplace)
