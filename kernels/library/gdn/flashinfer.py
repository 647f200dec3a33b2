"""FlashInfer's GDN kernels, called as SGLang/vLLM call them: the baselines of GDN decode and
prefill on sm_90 and sm_100.

FlashInfer updates the decode state in place; its prefill takes the gates already activated (in
fp32) and writes the final state to a separate buffer, which is copied back into `state` to keep
the ops' in-place contract.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kdispatch.registry import variant

_FLASHINFER = dict(backend="library", archs=("sm90", "sm100"), requires=("flashinfer",), baseline=True)


@variant("gdn_decode", "flashinfer", **_FLASHINFER)
def gdn_decode_flashinfer(q, k, v, state, A_log, a, dt_bias, b, scale):
    from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose

    out, _ = gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, scale=scale,
                                                  use_qk_l2norm=False)
    return out, state


@variant("gdn_prefill", "flashinfer", **_FLASHINFER)
def gdn_prefill_flashinfer(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    alpha = torch.exp(-torch.exp(A_log) * F.softplus(a.float() + dt_bias))
    beta = torch.sigmoid(b.float())
    new_state = torch.empty_like(state)
    out = chunk_gated_delta_rule(q, k, v, g=alpha, beta=beta, scale=scale, initial_state=state,
                                 output_final_state=True, cu_seqlens=cu_seqlens, output_state=new_state)
    if isinstance(out, tuple):
        out = out[0]
    return out, state.copy_(new_state)
