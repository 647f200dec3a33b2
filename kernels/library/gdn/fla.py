"""flash-linear-attention (fla-core)'s GDN kernels, what SGLang and vLLM run on Hopper: peer
variants where installed, never the baseline.

fla returns a new final state, so honouring the in-place contract costs one extra state copy. Prefill
is bracketed by kernels/cuda/gdn/prefill_guard.py (cu_seqlens checked on the device before fla
sees it; the state copy after, skipped for a malformed batch, whose output is zeroed).
"""
from __future__ import annotations

from kdispatch.registry import variant

_FLA = dict(backend="library", archs=("sm90", "sm100"), requires=("fla",))
_FLA_FLAGS = dict(output_final_state=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                  state_v_first=True)


@variant("gdn_decode", "fla_fused_recurrent", **_FLA)
def gdn_decode_fla(q, k, v, state, A_log, a, dt_bias, b, scale):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    out, final = fused_recurrent_gated_delta_rule(q, k, v, g=a, beta=b, scale=scale, initial_state=state,
                                                  A_log=A_log, dt_bias=dt_bias, **_FLA_FLAGS)
    return out, state.copy_(final)


@variant("gdn_prefill", "fla_chunk", **{**_FLA, "requires": ("fla", "cuda.core")})
def gdn_prefill_fla(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    from kdispatch.kernels.cuda.gdn import prefill_guard

    cu, verdict, _, _ = prefill_guard.guard(cu_seqlens, q.shape[0])
    out, final = chunk_gated_delta_rule(q[None], k[None], v[None], g=a[None], beta=b[None], scale=scale,
                                        initial_state=state, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu,
                                        **_FLA_FLAGS)
    return prefill_guard.commit(state, final, out[0], verdict)
