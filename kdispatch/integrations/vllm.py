"""kdispatch inside vLLM: GDN (Qwen3-Next, Qwen3.5) decode served by kdispatch's routed packed decode.

Turn it on: install kdispatch in vLLM's environment and set `KDISPATCH_VLLM=1`. vLLM calls every
`vllm.general_plugins` entry point in each worker before it builds the model (kdispatch's is
`register` below, declared in setup.py); with the switch unset the plugin does nothing.

What it replaces: the packed decode kernel vLLM's GDN layer calls for decode-only batches,
`fused_recurrent_gated_delta_rule_packed_decode` (its default with
VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=1): the layer module's reference to it is swapped for
`packed_decode_call`, which serves what kdispatch's `gdn_decode_packed` definitions cover (bf16
rows, an fp32 pool of 128 x 128 states, 4, 8, 16 or 32 value heads, int32 slots, L2 norm in the
kernel) and hands every other call to vLLM's function. The layer keeps its convolution, metadata,
prefill and speculative paths; a `PluggableLayer.register_oot` subclass would have had to re-implement
the layer's decode method around the same call. Padding: a slot outside the pool (-1) is a padding
row for kdispatch; vLLM versions that mark padding with slot 0 (their null block) get slot 0
updated as a real slot, which no request reads.

Check it is active: each worker logs "kdispatch: vLLM GDN packed decode replaced in <module>", and
`kdispatch.integrations.vllm.STATS` counts the calls kdispatch served and those it passed to vLLM.
"""
from __future__ import annotations

import importlib
import logging
import os

from kdispatch.integrations import packed_decode

SWITCH = "KDISPATCH_VLLM"
KERNEL = "fused_recurrent_gated_delta_rule_packed_decode"
# where vLLM's GDN layer has lived (newest first); the first that imports and holds KERNEL is patched
LAYER_MODULES = ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
                 "vllm.model_executor.layers.mamba.gdn_linear_attn",
                 "vllm.model_executor.models.qwen3_next")
STATS = {"served": 0, "passed": 0, "first_pass_reason": None}

logger = logging.getLogger(__name__)
_original = None


def enabled() -> bool:
    return os.environ.get(SWITCH, "").strip() not in ("", "0")


def register() -> str | None:
    """The `vllm.general_plugins` entry point: with KDISPATCH_VLLM set, swaps the GDN layer module's
    packed decode for `packed_decode_call`. Returns the patched module's name (None: nothing done)."""
    global _original
    if not enabled():
        return None
    for name in LAYER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        current = getattr(module, KERNEL, None)
        if current is None:
            continue
        if current is not packed_decode_call:
            _original = current
            setattr(module, KERNEL, packed_decode_call)
        logger.info("kdispatch: vLLM GDN packed decode replaced in %s (%s=%s)", name, SWITCH, os.environ[SWITCH])
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
        STATS["passed"] += 1
        STATS["first_pass_reason"] = STATS["first_pass_reason"] or why
        return _original(mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                         initial_state=initial_state, out=out, ssm_state_indices=ssm_state_indices,
                         use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    STATS["served"] += 1
    packed_decode.serve(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, ssm_state_indices, out)
    return out, initial_state
