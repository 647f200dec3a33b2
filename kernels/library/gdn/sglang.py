"""SGLang's GDN paths on Hopper, the baselines of the engine-convention definitions, each called as
its GDN backend calls it:
- decode (gdn_decode_packed_*): its Triton packed decode (`fused_recurrent_gated_delta_rule_packed_decode`,
  q/k/v packed, L2 norm and gates in the kernel, the state pool updated in place through slot
  indices). vLLM's default decode kernel has the same contract.
- prefill (gdn_prefill_pool_*): SGLang 0.5.23 defaults GDN prefill on sm_90 to FlashInfer
  (`flashinfer_gdn_prefill_default`; its `FlashInferGDNKernel.extend`): q/k L2-normalised by its
  Triton `gdn_prefill_qkv_prepare_fwd`, alpha = exp(g), the slots' states gathered into a
  contiguous batch, FlashInfer's `chunk_gated_delta_rule` into a new final-state buffer, the finals
  written back to the pool.
- verify (gdn_verify_*): its Triton `fused_sigmoid_gating_delta_rule_update` with the state update
  disabled and every step's state cached (`TritonGDNKernel.target_verify`, SGLang's verify kernel on
  Hopper unless decode runs on FlashInfer).

Loading: through kernels/library/sglang_loader.py (SGLang's kernel modules without its server
stack; inside the engine, SGLang's own modules). Stage the wheel for the GPU machine with
`benchmarks/stage_engines.sh`.

Safety: SGLang's decode kernel treats a negative slot as padding but trusts the others; the wrapper
sends slots past the pool's end to -1 first (kernels/cuda/gdn/slot_guard.py, one launch), so no
index reads or writes outside it. For prefill, the gather and scatter (kernels/cuda/gdn/pool_states.py,
one launch each, as SGLang's indexing ops) skip padding slots and zero their output rows, and
cu_seqlens is checked on the device first (kernels/cuda/gdn/prefill_guard.py, which replaces SGLang's
`.to(torch.int64)` launch): a malformed batch writes nothing back. For verify, one launch
(`slot_guard.verify_guard`) sends slots and cache rows outside their tensors to -1, and the row of a
request longer than a cache row's steps (SGLang's kernel would store past the row), and replaces
malformed boundaries by the even partition. The tuner times decode and verify as SGLang calls them,
without the guard (`engine=`, kdispatch/registry.py): the plugins hand the calls routed to these
baselines back to SGLang's own kernel, so that is what the variants must beat. (Prefill's guard and
gather/scatter launches stand in for SGLang's own indexing launches one for one.)
"""
from __future__ import annotations

import torch

from kdispatch.definitions.gdn.names import PACKED_HEADS, packed_name, pool_prefill_name, verify_name
from kdispatch.kernels.cuda.gdn import pool_states, prefill_guard, slot_guard
from kdispatch.kernels.library.sglang_loader import sglang_function
from kdispatch.registry import variant

DECODE_MODULE = "sglang.kernels.ops.attention.fla.fused_recurrent"
VERIFY_MODULE = "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent"
PREPARE_MODULE = "sglang.kernels.ops.attention.fla.l2norm"


def packed_decode_kernel():
    """SGLang's fused_recurrent_gated_delta_rule_packed_decode."""
    return sglang_function(DECODE_MODULE, "fused_recurrent_gated_delta_rule_packed_decode")


def gdn_decode_packed_sglang(mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out, scale):
    slots = slot_guard.safe_slots(state_indices, state_pool.shape[0])
    return packed_decode_engine(mixed_qkv, a, b, A_log, dt_bias, state_pool, slots, out, scale)


def packed_decode_engine(mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out, scale):
    """SGLang's packed decode as its backend calls it, trusting the slots (what an engine user has)."""
    if not state_pool[0].is_contiguous():  # SGLang's kernel steps slots by stride(0), nothing else
        raise ValueError("sglang_packed_decode: each slot of state_pool must be contiguous")
    packed_decode_kernel()(mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                           scale=scale or state_pool.shape[-1] ** -0.5, initial_state=state_pool, out=out,
                           ssm_state_indices=state_indices, use_qk_l2norm_in_kernel=True)
    return out, state_pool


for _hq, _hv in PACKED_HEADS.values():
    variant(packed_name(_hq, _hv), "sglang_packed_decode", backend="library", archs=("sm90", "sm100"),
            requires=("sglang", "triton", "cuda.core"), baseline=True, strided=True,
            engine=packed_decode_engine)(gdn_decode_packed_sglang)


def gdn_prefill_pool_sglang(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out,
                            scale):
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    T = q.shape[0]
    q, k, v = sglang_function(PREPARE_MODULE, "gdn_prefill_qkv_prepare_fwd")(q, k, v)
    alpha = torch.exp(g.to(torch.float32))
    cu, verdict, _, _ = prefill_guard.guard(cu_seqlens, T, out=out, malformed="empty")
    initial = pool_states.gather(state_pool, state_indices, has_initial_state)
    final = torch.empty_like(initial)
    chunk_gated_delta_rule(q, k, v, g=alpha, beta=beta.to(torch.float32), scale=scale, initial_state=initial,
                           output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=False, output=out,
                           output_state=final)
    pool_states.scatter(state_pool, state_indices, final, initial, verdict, cu, out)
    return out, state_pool


for _hq, _hv in PACKED_HEADS.values():
    variant(pool_prefill_name(_hq, _hv), "sglang_flashinfer_prefill", backend="library", archs=("sm90",),
            requires=("sglang", "flashinfer", "triton", "cuda.core"), baseline=True,
            strided=True)(gdn_prefill_pool_sglang)


def gdn_verify_sglang(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, cu_seqlens, intermediate_states,
                      cache_indices, scale):
    slots, rows, cu = slot_guard.verify_guard(state_indices, cache_indices, cu_seqlens, q.shape[0],
                                              state_pool.shape[0], *intermediate_states.shape[:2])
    return verify_call(q, k, v, a, b, A_log, dt_bias, state_pool, slots, cu, intermediate_states, rows, scale)


def verify_call(q, k, v, a, b, A_log, dt_bias, state_pool, slots, cu_seqlens, intermediate_states, rows, scale):
    """SGLang's verify kernel called as `TritonGDNKernel.target_verify` calls it (on safe indices in
    the baseline; as given, the engine's own call)."""
    if not state_pool[0].is_contiguous():  # the kernel steps slots by stride(0), nothing else
        raise ValueError("sglang_verify: each slot of state_pool must be contiguous")
    if q.stride(1) != q.shape[2] or k.stride(1) != k.shape[2] or v.stride(1) != v.shape[2]:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # heads adjacent within a token
    out = sglang_function(VERIFY_MODULE, "fused_sigmoid_gating_delta_rule_update")(
        A_log=A_log, a=a, dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0, q=q[None], k=k[None],
        v=v[None], b=b, initial_state_source=state_pool, initial_state_indices=slots, scale=scale or None,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens, is_kda=False, disable_state_update=True,
        intermediate_states_buffer=intermediate_states, intermediate_state_indices=rows,
        cache_steps=intermediate_states.shape[1], retrieve_parent_token=None)
    return out[0], intermediate_states


for _hq, _hv in PACKED_HEADS.values():
    variant(verify_name(_hq, _hv), "sglang_verify", backend="library", archs=("sm90", "sm100"),
            requires=("sglang", "triton", "cuda.core"), baseline=True, strided=True, engine=verify_call)(gdn_verify_sglang)
