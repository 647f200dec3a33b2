"""FlashInfer's GDN kernels, called as SGLang/vLLM call them: the baselines of GDN decode and
prefill on sm_90 and sm_100.

FlashInfer updates the decode state in place; its prefill takes the gates already activated (in
fp32) and writes the final states where `output_state` says: the initial states themselves, each
sequence's read before it is overwritten, so the ops' in-place contract costs no copy. Prefill is
preceded by one launch (kernels/cuda/gdn/prefill_guard.py: cu_seqlens checked on the device, the
gates activated; a malformed batch becomes N empty sequences, whose final states are their initial
ones, and its output is zeroed there, since FlashInfer then writes none of it), so no cu_seqlens
value reaches FlashInfer unchecked and nothing runs after it.
"""
from __future__ import annotations

import torch

from kdispatch.registry import variant

_FLASHINFER = dict(backend="library", archs=("sm90", "sm100"), requires=("flashinfer",), baseline=True)


@variant("gdn_decode", "flashinfer", **_FLASHINFER)
def gdn_decode_flashinfer(q, k, v, state, A_log, a, dt_bias, b, scale):
    from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose

    out, _ = gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, scale=scale,
                                                  use_qk_l2norm=False)
    return out, state


_PREFILL = {**_FLASHINFER, "requires": ("flashinfer", "cuda.core")}


def gdn_prefill_flashinfer(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale, use_cp="auto"):
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    from kdispatch.kernels.cuda.gdn import prefill_guard

    out = torch.empty(q.shape[0], v.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
    cu, _, alpha, beta = prefill_guard.guard(cu_seqlens, q.shape[0], gates=(A_log, a, dt_bias, b), out=out,
                                             malformed="empty")
    chunk_gated_delta_rule(q, k, v, g=alpha, beta=beta, scale=scale, initial_state=state,
                           output_final_state=True, cu_seqlens=cu, output=out, output_state=state, use_cp=use_cp)
    return out, state


variant("gdn_prefill", "flashinfer", **_PREFILL)(gdn_prefill_flashinfer)
# FlashInfer's "auto" takes its context-parallel path whenever sequences x heads is below about one
# wave of SMs, however short the sequences: at 8 value heads, 2-8 sequences of 100-1,000 tokens took
# 50-86 us where 18-20 sequences of 1,100-1,300 tokens took 25-28 (H100 rows, 2026-11-27). Without
# CP, a launch configuration measured like any other.
variant("gdn_prefill", "flashinfer", **{**_PREFILL, "baseline": False},
        configs={"cp_off": {"use_cp": False}})(gdn_prefill_flashinfer)
