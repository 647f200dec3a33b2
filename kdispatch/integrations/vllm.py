"""kdispatch inside vLLM: GDN (Qwen3-Next, Qwen3.5) decode and speculative verification served by
kdispatch's routed ops.

Turn it on: install kdispatch in vLLM's environment and set `KDISPATCH_VLLM=1`. vLLM calls every
`vllm.general_plugins` entry point in each worker before it builds the model (kdispatch's is
`register` below, declared in setup.py); with the switch unset the plugin does nothing.

What it replaces: two kernels vLLM's GDN layer module calls, its references to them swapped for
kdispatch's functions, which serve what kdispatch's definitions cover and hand every other call to
vLLM's function:
- `fused_recurrent_gated_delta_rule_packed_decode` (decode-only batches; its default with
  VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=1) -> `packed_decode_call`, serving the
  `gdn_decode_packed` definitions (bf16 rows, an fp32 pool of 128 x 128 states, 4, 8, 16 or 32
  value heads, int32 slots, L2 norm in the kernel). Padding: a slot outside the pool (-1) is a
  padding row for kdispatch; vLLM versions that mark padding with slot 0 (their null block) get
  slot 0 updated as a real slot, which no request reads.
- `fused_sigmoid_gating_delta_rule_update` (vLLM >= 0.20) -> `sigmoid_gating_call`, serving its
  speculative-verify calls (per-step slots [N, S] and accepted counts; the `gdn_verify_steps`
  definitions, whose slot 0 is vLLM's null block as in vLLM >= 0.20) where a router for the GPU
  exists (their baseline is the torch reference); its 1-D-slot decode calls and every other call
  stay vLLM's.
The layer keeps its convolution, metadata and prefill paths; a `PluggableLayer.register_oot`
subclass would have had to re-implement the layer's methods around the same calls.

Check it is active: each worker logs "kdispatch: vLLM GDN kernels replaced in <module>", and
`kdispatch.integrations.vllm.STATS` / `VERIFY_STATS` count the calls kdispatch served and those it
passed to vLLM.
"""
from __future__ import annotations

import importlib
import logging
import os

from kdispatch.integrations import packed_decode, serving, verify

SWITCH = "KDISPATCH_VLLM"
KERNEL = "fused_recurrent_gated_delta_rule_packed_decode"
VERIFY_KERNEL = "fused_sigmoid_gating_delta_rule_update"
# where vLLM's GDN layer has lived (newest first); the first that imports and holds KERNEL is patched
LAYER_MODULES = ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
                 "vllm.model_executor.layers.mamba.gdn_linear_attn",
                 "vllm.model_executor.models.qwen3_next")
STATS = {"served": 0, "passed": 0, "first_pass_reason": None}  # packed decode
VERIFY_STATS = {"served": 0, "passed": 0, "first_pass_reason": None}

logger = logging.getLogger(__name__)
_originals: dict = {}  # kernel name -> vLLM's function


def _passed(stats: dict, why: str) -> None:
    stats["passed"] += 1
    stats["first_pass_reason"] = stats["first_pass_reason"] or why


def enabled() -> bool:
    return os.environ.get(SWITCH, "").strip() not in ("", "0")


def register() -> str | None:
    """The `vllm.general_plugins` entry point: with KDISPATCH_VLLM set, swaps the GDN layer module's
    packed decode for `packed_decode_call` and, where the module has it, its sigmoid-gating kernel
    for `sigmoid_gating_call`. Returns the patched module's name (None: nothing done)."""
    if not enabled():
        return None
    for name in LAYER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, KERNEL, None) is None:
            continue
        for kernel, ours in ((KERNEL, packed_decode_call), (VERIFY_KERNEL, sigmoid_gating_call)):
            current = getattr(module, kernel, None)
            if current is not None and current is not ours:
                _originals[kernel] = current
                setattr(module, kernel, ours)
        logger.info("kdispatch: vLLM GDN kernels replaced in %s: %s (%s=%s)", name,
                    ", ".join(k for k in (KERNEL, VERIFY_KERNEL) if k in _originals), SWITCH, os.environ[SWITCH])
        return name
    logger.warning("kdispatch: no vLLM GDN layer module with %s found (%s): nothing replaced", KERNEL,
                   ", ".join(LAYER_MODULES))
    return None


def packed_decode_call(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out, ssm_state_indices,
                       use_qk_l2norm_in_kernel=False):
    """vLLM's packed decode contract: writes [B, 1, HV, V] into `out`, the states into the pool in
    place; returns (out, initial_state)."""
    heads, width = out.shape[-2], out.shape[-1]
    why = ("no L2 norm in the kernel" if not use_qk_l2norm_in_kernel else
           f"out {tuple(out.shape)} {out.dtype}" if out.dim() != 4 or out.dtype != mixed_qkv.dtype
           or not out.is_contiguous() else
           packed_decode.not_covered(mixed_qkv, a, b, initial_state, ssm_state_indices, heads, width))
    if why is not None:
        _passed(STATS, why)
        return _originals[KERNEL](mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                         initial_state=initial_state, out=out, ssm_state_indices=ssm_state_indices,
                         use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)

    def ours():
        packed_decode.serve(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, ssm_state_indices, out)
        return out, initial_state

    return serving.attempt(STATS, serving.gdn_short("decode_packed", heads), mixed_qkv.device, ours,
                           lambda: _originals[KERNEL](mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                                                      scale=scale, initial_state=initial_state, out=out,
                                                      ssm_state_indices=ssm_state_indices,
                                                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel))


def sigmoid_gating_call(A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None, initial_state=None,
                        inplace_final_state=True, cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                        use_qk_l2norm_in_kernel=False, **kwargs):
    """vLLM's fused_sigmoid_gating_delta_rule_update contract: returns (output [1, T, HV, V],
    initial_state), the states written into the pool in place. Speculative-verify calls (2-D slots,
    accepted counts) that `gdn_verify_steps` covers are kdispatch's; the rest vLLM's. A CUDA-graph
    bucket's slots and counts may have more rows than requests: the first len(cu_seqlens) - 1 count."""
    if cu_seqlens is not None and ssm_state_indices is not None and num_accepted_tokens is not None:
        n = cu_seqlens.shape[0] - 1
        slots, accepted = ssm_state_indices[:n], num_accepted_tokens[:n]
    why = ("not a speculative-verify call" if ssm_state_indices is None or ssm_state_indices.dim() != 2
           or num_accepted_tokens is None or cu_seqlens is None else
           "KDA gates" if kwargs.get("is_kda") else
           "no L2 norm in the kernel, or states not written in place" if not (use_qk_l2norm_in_kernel and
                                                                               inplace_final_state) else
           f"softplus beta {beta}, threshold {threshold}" if (beta, threshold) != (1.0, 20.0) else
           "inputs not [1, T, ...]" if q.dim() != 4 or q.shape[0] != 1 else
           verify.not_covered_steps(q[0], k[0], v[0], a, b, initial_state, slots, accepted, cu_seqlens))
    if why is not None:
        _passed(VERIFY_STATS, why)
        return _originals[VERIFY_KERNEL](
            A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, beta=beta, threshold=threshold, scale=scale,
            initial_state=initial_state, inplace_final_state=inplace_final_state, cu_seqlens=cu_seqlens,
            ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)

    def ours():
        out = verify.serve_steps(q[0], k[0], v[0], a, b, A_log, dt_bias, initial_state, slots, accepted, cu_seqlens,
                                 scale)
        return out[None], initial_state

    return serving.attempt(
        VERIFY_STATS, serving.gdn_short("verify_steps", v.shape[2]), v.device, ours,
        lambda: _originals[VERIFY_KERNEL](
            A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v, beta=beta, threshold=threshold, scale=scale,
            initial_state=initial_state, inplace_final_state=inplace_final_state, cu_seqlens=cu_seqlens,
            ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs))
