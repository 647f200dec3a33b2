"""kdispatch inside SGLang: GDN (Qwen3-Next) decode served by kdispatch's routed packed decode.

Turn it on: install kdispatch in SGLang's environment and set `KDISPATCH_SGLANG=1`. SGLang calls
every `sglang.srt.plugins` entry point in each of its processes (kdispatch's is `register` below,
declared in setup.py); with the switch unset the plugin does nothing.

What it replaces: `TritonGDNKernel.packed_decode`, what SGLang's GDN backend calls for decode on
Hopper (its Triton packed decode: q/k/v packed per request, the state pool updated in place through
slot indices). An AROUND hook sends each call that kdispatch's `gdn_decode_packed` definitions cover
(bf16 rows, an fp32 pool of 128 x 128 states, 4, 8, 16 or 32 value heads with half as many q/k
heads, int32 slots; no ReplaySSM ring caches) to `kdispatch.ops.gdn_decode_packed`, and every other
call to SGLang's own kernel. Extend (prefill), target verify and the other kernel backends stay
SGLang's.

Check it is active: each process logs "kdispatch: SGLang GDN packed decode hooked" at startup, and
`kdispatch.integrations.sglang.STATS` counts the calls kdispatch served and those it passed to
SGLang (with the first reason).
"""
from __future__ import annotations

import logging
import os

from kdispatch.integrations import packed_decode

SWITCH = "KDISPATCH_SGLANG"
TARGET = "sglang.srt.layers.attention.linear.kernels.gdn_triton.TritonGDNKernel.packed_decode"
RING_CACHES = ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_write_pos")  # SGLang's ReplaySSM decode
STATS = {"served": 0, "passed": 0, "first_pass_reason": None}

logger = logging.getLogger(__name__)


def enabled() -> bool:
    return os.environ.get(SWITCH, "").strip() not in ("", "0")


def register() -> bool:
    """The `sglang.srt.plugins` entry point: hooks the packed decode when KDISPATCH_SGLANG is set.
    Returns whether it registered the hook."""
    if not enabled():
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, hook, HookType.AROUND)
    logger.info("kdispatch: SGLang GDN packed decode hooked (%s=%s)", SWITCH, os.environ[SWITCH])
    return True


def hook(original, self, mixed_qkv, a, b, *, A_log, dt_bias, scale, ssm_states, cache_indices, num_v_heads,
         head_v_dim, **kwargs):
    """AROUND hook of TritonGDNKernel.packed_decode: same arguments, same result ([1, B, HV, V])."""
    why = ("ReplaySSM ring caches" if any(kwargs.get(k) is not None for k in RING_CACHES) else
           packed_decode.not_covered(mixed_qkv, a, b, ssm_states, cache_indices, num_v_heads, head_v_dim))
    if why is not None:
        STATS["passed"] += 1
        STATS["first_pass_reason"] = STATS["first_pass_reason"] or why
        return original(self, mixed_qkv, a, b, A_log=A_log, dt_bias=dt_bias, scale=scale, ssm_states=ssm_states,
                        cache_indices=cache_indices, num_v_heads=num_v_heads, head_v_dim=head_v_dim, **kwargs)
    STATS["served"] += 1
    out = mixed_qkv.new_empty(mixed_qkv.shape[0], 1, num_v_heads, head_v_dim)
    packed_decode.serve(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, cache_indices, out)
    return out.transpose(0, 1)
