"""Baselines: the project's reference for every definition and device, and the official FlashInfer
calls on the architectures that run them (GDN decode and prefill on sm_90 and sm_100).

DSA and MoE have no official call here: DeepGEMM and FlashInfer's sparse MLA and fused MoE are not
available for sm_90 in this environment, so their baseline on sm_90 is the project's reference.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F

from kdispatch.references import dsa_sparse_attention, dsa_topk_indexer, gdn_decode, gdn_prefill, moe_fp8
from kdispatch.registry import ANY_ARCH, REFERENCE, variant

_ref = dict(name=REFERENCE, backend="torch", archs=(ANY_ARCH,))

variant("moe_fp8", **_ref)(moe_fp8.run)
variant("dsa_topk_indexer", **_ref)(dsa_topk_indexer.run)
variant("dsa_sparse_attention", **_ref)(dsa_sparse_attention.run)


@variant("gdn_decode", **_ref, sources=(gdn_decode.__file__,))
def gdn_decode_reference(q, k, v, state, A_log, a, dt_bias, b, scale):
    out, new_state = gdn_decode.run(q, k, v, state, A_log, a, dt_bias, b, scale)
    return out, state.copy_(new_state)  # the ops' in-place state contract


@variant("gdn_prefill", **_ref, sources=(gdn_prefill.__file__,))
def gdn_prefill_reference(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    out, new_state = gdn_prefill.run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale)
    return out, state.copy_(new_state)


_fi = dict(backend="library", archs=("sm90", "sm100"), requires=("flashinfer",), baseline=True)


@variant("gdn_decode", "flashinfer", **_fi)
def gdn_decode_flashinfer(q, k, v, state, A_log, a, dt_bias, b, scale):
    from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose

    out, _ = gated_delta_rule_decode_pretranspose(q, k, v, state, A_log, a, dt_bias, b, scale=scale,
                                                  use_qk_l2norm=False)
    return out, state  # FlashInfer updates the fp32 state in place


@variant("gdn_prefill", "flashinfer", **_fi)
def gdn_prefill_flashinfer(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    # FlashInfer takes the gates already activated, in fp32.
    alpha = torch.exp(-torch.exp(A_log) * F.softplus(a.float() + dt_bias))
    beta = torch.sigmoid(b.float())
    new_state = torch.empty_like(state)
    out = chunk_gated_delta_rule(q, k, v, g=alpha, beta=beta, scale=scale, initial_state=state,
                                 output_final_state=True, cu_seqlens=cu_seqlens, output_state=new_state)
    if isinstance(out, tuple):
        out = out[0]
    return out, state.copy_(new_state)


# fla-core (what SGLang and vLLM run on Hopper): a peer variant where installed, never the baseline.
# It returns a new final state, so honouring the in-place contract costs one extra state copy.
_fla = dict(backend="library", archs=("sm90", "sm100"), requires=("fla",))
_FLA_FLAGS = dict(output_final_state=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  state_v_first=True)


@variant("gdn_decode", "fla_fused_recurrent", **_fla)
def gdn_decode_fla(q, k, v, state, A_log, a, dt_bias, b, scale):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    out, final = fused_recurrent_gated_delta_rule(q, k, v, g=a, beta=b, scale=scale, initial_state=state,
                                                  A_log=A_log, dt_bias=dt_bias, **_FLA_FLAGS)
    return out, state.copy_(final)


@variant("gdn_prefill", "fla_chunk", **_fla)
def gdn_prefill_fla(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    out, final = chunk_gated_delta_rule(q[None], k[None], v[None], g=a[None], beta=b[None], scale=scale,
                                        initial_state=state, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu_seqlens,
                                        **_FLA_FLAGS)
    return out[0], state.copy_(final)
