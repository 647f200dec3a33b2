"""vLLM's GDN prefill call on Hopper, the baseline of the gathered-prefill definitions
(gdn_prefill_gathered_*): FlashInfer's chunked prefill as vLLM 0.33's `fi_chunk_gated_delta_rule`
calls it from its GDN layer (q/k/v made contiguous, the states as fp32, alpha = exp(g), cu_seqlens
as int64, FlashInfer's split path on "auto", a new final-state tensor that vLLM then scatters into
its pool; vLLM normalised q/k before).

`gdn_prefill_gathered_vllm` is what kdispatch.ops runs: the prefill guard (kernels/cuda/gdn/
prefill_guard.py, one launch in place of vLLM's int64 conversion and exp(g)) checks cu_seqlens on
the device first, so a malformed batch becomes N empty sequences with a zeroed output and no value
reaches FlashInfer unchecked; FlashInfer writes the final states over the initial ones (`output_state=initial_state`:
each sequence's state is read before it is overwritten), the definition's in-place contract. The
tuner times `vllm_call`, vLLM's own call (`engine=`): the vLLM plugin hands the calls routed to this
baseline back to vLLM's function, so that is what the variants must beat.
"""
from __future__ import annotations

import torch

from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, gathered_prefill_name
from kdispatch.kernels.cuda.gdn import prefill_guard
from kdispatch.registry import variant


def gdn_prefill_gathered_vllm(q, k, v, g, beta, initial_state, cu_seqlens, out, scale, use_cp="auto"):
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    cu, _, alpha, _ = prefill_guard.guard(cu_seqlens, q.shape[0], log_decay=g, out=out, malformed="empty")
    chunk_gated_delta_rule(q.contiguous(), k.contiguous(), v.contiguous(), g=alpha, beta=beta, scale=scale,
                           initial_state=initial_state, output_final_state=True, cu_seqlens=cu, output=out,
                           output_state=initial_state, use_cp=use_cp)
    return out, initial_state


def vllm_call(q, k, v, g, beta, initial_state, cu_seqlens, out, scale):
    """vLLM's fi_chunk_gated_delta_rule as its layer calls it (use_qk_l2norm_in_kernel=False, no scale:
    FlashInfer's default 1/sqrt(128), the model's), trusting cu_seqlens. Returns (output, final states)."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    return chunk_gated_delta_rule(
        q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=torch.exp(g.to(torch.float32)),
        beta=beta.to(torch.float32), initial_state=initial_state.to(torch.float32), output_final_state=True,
        cu_seqlens=cu_seqlens.to(torch.int64), use_cp="auto", backend="flashinfer")


for _hq, _hv in GATHERED_HEADS.values():
    variant(gathered_prefill_name(_hq, _hv), "vllm_flashinfer_prefill", backend="library", archs=("sm90",),
            requires=("flashinfer", "cuda.core"), baseline=True, engine=vllm_call)(gdn_prefill_gathered_vllm)
    # the same call without FlashInfer's context-parallel path (kernels/library/gdn/flashinfer.py says why)
    variant(gathered_prefill_name(_hq, _hv), "vllm_flashinfer_prefill", backend="library", archs=("sm90",),
            requires=("flashinfer", "cuda.core"), configs={"cp_off": {"use_cp": False}})(gdn_prefill_gathered_vllm)
