"""kdispatch inside SGLang: GDN (Qwen3-Next) decode and prefill served by kdispatch's routed ops.

Turn it on: install kdispatch in SGLang's environment and set `KDISPATCH_SGLANG=1`. SGLang calls
every `sglang.srt.plugins` entry point in each of its processes (kdispatch's is `register` below,
declared in setup.py); with the switch unset the plugin does nothing.

What it replaces, through AROUND hooks in SGLang's HookRegistry:
- decode: `TritonGDNKernel.packed_decode`, what SGLang's GDN backend calls for decode on Hopper (its
  Triton packed decode: q/k/v packed per request, the state pool updated in place through slot
  indices). Calls that kdispatch's `gdn_decode_packed` definitions cover (bf16 rows, an fp32 pool
  of 128 x 128 states, 4, 8, 16 or 32 value heads with half as many q/k heads, int32 slots; no
  ReplaySSM ring caches) go to `kdispatch.ops.gdn_decode_packed`.
- prefill: `extend` of `FlashInferGDNKernel` (SGLang's default prefill on sm_90 and sm_100) and of
  `TritonGDNKernel`. Calls that the `gdn_prefill_pool` definitions cover (bf16 q/k/v, fp32 gates
  and pool, int32 slots and boundaries; no state checkpoints, no tracked states, in-place update) go
  to `kdispatch.ops.gdn_prefill_pool`, every sequence starting from its slot (SGLang zeroes a
  request's slot when it allocates it), with the batch's longest sequence as `max_seq_len`: a
  BEFORE hook on `GDNAttnBackend.init_forward_metadata` notes it from the batch's host-side
  `extend_seq_lens_cpu` (the kernel's `extend` does not receive it), for the forward's extend calls
  with as many sequences.
- verify: `TritonGDNKernel.target_verify` (SGLang's linear-chain MTP verify on Hopper). Calls that the
  `gdn_verify` definitions cover (bf16 inputs, fp32 pool and intermediate-states buffer, int32
  indices; no draft tree) go to `kdispatch.ops.gdn_verify`.
Every other call goes to SGLang's own kernel; the other kernel backends stay SGLang's.

Check it is active: each process logs "kdispatch: SGLang GDN kernels hooked" at startup, and
`kdispatch.integrations.sglang.STATS` counts the calls kdispatch served and those it passed to
SGLang (with the first reason), per kernel method.
"""
from __future__ import annotations

import logging
import os

import torch

from kdispatch.definitions.gdn.gathered import all_true
from kdispatch.integrations import packed_decode, pool_prefill, serving, verify

SWITCH = "KDISPATCH_SGLANG"
KERNELS = "sglang.srt.layers.attention.linear.kernels"
TARGET = f"{KERNELS}.gdn_triton.TritonGDNKernel.packed_decode"
EXTEND_TARGETS = (f"{KERNELS}.gdn_flashinfer.FlashInferGDNKernel.extend", f"{KERNELS}.gdn_triton.TritonGDNKernel.extend")
VERIFY_TARGET = f"{KERNELS}.gdn_triton.TritonGDNKernel.target_verify"
METADATA_TARGET = "sglang.srt.layers.attention.linear.gdn_backend.GDNAttnBackend.init_forward_metadata"
RING_CACHES = ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_write_pos")  # SGLang's ReplaySSM decode
STATS = {"served": 0, "passed": 0, "first_pass_reason": None}  # packed decode
EXTEND_STATS = {"served": 0, "passed": 0, "first_pass_reason": None}
VERIFY_STATS = {"served": 0, "passed": 0, "first_pass_reason": None}

logger = logging.getLogger(__name__)


def enabled() -> bool:
    return os.environ.get(SWITCH, "").strip() not in ("", "0")


def register() -> bool:
    """The `sglang.srt.plugins` entry point: hooks the packed decode and the prefill kernels when
    KDISPATCH_SGLANG is set. Returns whether it registered the hooks."""
    if not enabled():
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, hook, HookType.AROUND)
    for target in EXTEND_TARGETS:
        HookRegistry.register(target, extend_hook, HookType.AROUND)
    HookRegistry.register(VERIFY_TARGET, verify_hook, HookType.AROUND)
    HookRegistry.register(METADATA_TARGET, note_lengths, HookType.BEFORE)
    logger.info("kdispatch: SGLang GDN kernels hooked: packed decode, extend, target verify (%s=%s)", SWITCH,
                os.environ[SWITCH])
    return True


def note_lengths(backend, forward_batch, *args, **kwargs):
    """BEFORE hook of GDNAttnBackend.init_forward_metadata: keeps the batch's sequence count and
    longest extend length (host-side, no sync) for its extend calls; changes nothing."""
    lens = getattr(forward_batch, "extend_seq_lens_cpu", None)
    pool_prefill.note_batch(len(lens) if lens else 0, max(lens) if lens else None)


def hook(original, self, mixed_qkv, a, b, *, A_log, dt_bias, scale, ssm_states, cache_indices, num_v_heads,
         head_v_dim, **kwargs):
    """AROUND hook of TritonGDNKernel.packed_decode: same arguments, same result ([1, B, HV, V])."""
    def engine():
        return original(self, mixed_qkv, a, b, A_log=A_log, dt_bias=dt_bias, scale=scale, ssm_states=ssm_states,
                        cache_indices=cache_indices, num_v_heads=num_v_heads, head_v_dim=head_v_dim, **kwargs)

    short = serving.gdn_short("decode_packed", num_v_heads)
    why = "ReplaySSM ring caches" if kwargs and any(kwargs.get(k) is not None for k in RING_CACHES) else None
    if why is None and serving.given_back(short, num_v_heads, mixed_qkv.device,
                                          lambda: packed_decode.axes(mixed_qkv.shape[0], ssm_states),
                                          serving.strided_views(mixed_qkv, a, b, ssm_states)):
        why = f"{short}: routed to the baseline for this shape"
    why = why or packed_decode.not_covered(mixed_qkv, a, b, ssm_states, cache_indices, num_v_heads, head_v_dim)
    if why is not None:
        serving.passed(STATS, why)
        return engine()

    def ours():
        out = mixed_qkv.new_empty(mixed_qkv.shape[0], 1, num_v_heads, head_v_dim)
        packed_decode.serve(mixed_qkv, a, b, A_log, dt_bias, scale, ssm_states, cache_indices, out)
        return out.transpose(0, 1)

    return serving.attempt(STATS, short, mixed_qkv.device, ours, engine)


def extend_hook(original, self, q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, **kwargs):
    """AROUND hook of the GDN kernels' `extend`: same arguments (q/k/v [1, T, H, 128], g/beta
    [1, T, HV]), same result: (output [1, T, HV, 128], None, None)."""
    def engine():
        return original(self, q, k, v, g, beta, ssm_states=ssm_states, cache_indices=cache_indices,
                        query_start_loc=query_start_loc, **kwargs)

    output = kwargs.get("output")
    n = query_start_loc.shape[0] - 1
    why = ("state checkpoints" if kwargs.get("num_state_checkpoints") or kwargs.get("track_state") is not None
           else "no in-place state update" if kwargs.get("inplace_update", True) is False
           else "inputs not [1, T, ...]" if q.dim() != 4 or q.shape[0] != 1 or g.dim() != 3 or v.dim() != 4
           else "an output buffer other than contiguous bf16 [1, T, HV, 128]"
           if output is not None and (tuple(output.shape) != tuple(v.shape) or output.dtype != torch.bfloat16
                                      or not output.is_contiguous())
           else "fewer slots than sequences" if cache_indices.shape[0] < n
           else None)
    if why is None:
        short = serving.gdn_short("prefill_pool", v.shape[2])
        features = pool_prefill.axes(v.shape[1], n, ssm_states, pool_prefill.batch_longest(n))
        strided = serving.strided_views(q, k, v, ssm_states)
        decided = serving.decision(short, v.shape[2], v.device, lambda: features, strided)
        if decided is not None and decided[1]:
            serving.passed(EXTEND_STATS, f"{short}: routed to the baseline for this shape")
            return engine()
        q0, k0, v0, g0, beta0 = q.squeeze(0), k.squeeze(0), v.squeeze(0), g.squeeze(0), beta.squeeze(0)
        slots = cache_indices[:n]  # a graph bucket may pass more slots
        why = pool_prefill.not_covered(q0, k0, v0, g0, beta0, ssm_states, slots, query_start_loc)
    if why is not None:
        serving.passed(EXTEND_STATS, why)
        return engine()

    def ours():
        out = output if output is not None else torch.empty_like(v, memory_format=torch.contiguous_format)
        pool_prefill.serve(short, features, strided, decided[0], q0, k0, v0, g0, beta0, ssm_states, slots,
                           all_true(n, slots.device), query_start_loc, out[0])
        return out, None, None

    return serving.attempt(EXTEND_STATS, short, v.device, ours, engine)


def verify_hook(original, self, A_log, dt_bias, q, k, v, a, b, *, ssm_states, cache_indices, query_start_loc,
                intermediate_states_buffer=None, intermediate_state_indices=None, retrieve_parent_token=None,
                **kwargs):
    """AROUND hook of TritonGDNKernel.target_verify: same arguments (q/k/v [1, T, H, 128], a/b
    [T, HV]), same result: the output [1, T, HV, 128]; the pool is not written."""
    def engine():
        return original(self, A_log, dt_bias, q, k, v, a, b, ssm_states=ssm_states, cache_indices=cache_indices,
                        query_start_loc=query_start_loc, intermediate_states_buffer=intermediate_states_buffer,
                        intermediate_state_indices=intermediate_state_indices,
                        retrieve_parent_token=retrieve_parent_token, **kwargs)

    buffer = intermediate_states_buffer
    n = query_start_loc.shape[0] - 1
    why = ("a draft tree (retrieve_parent_token)" if retrieve_parent_token is not None
           else "inputs not [1, T, ...]" if q.dim() != 4 or q.shape[0] != 1 or v.dim() != 4
           else "fewer slots than requests" if cache_indices.shape[0] < n
           else None)
    if why is None:
        short = serving.gdn_short("verify", v.shape[2])
        if buffer is not None and buffer.dim() == 5 and \
                serving.given_back(short, v.shape[2], v.device, lambda: verify.axes(v.shape[1], n, ssm_states, buffer),
                                   serving.strided_views(q, k, v, a, b, ssm_states)):
            serving.passed(VERIFY_STATS, f"{short}: routed to the baseline for this shape")
            return engine()
        q0, k0, v0, slots = q[0], k[0], v[0], cache_indices[:n]  # a CUDA-graph bucket may pass more
        rows = intermediate_state_indices[:n] if intermediate_state_indices is not None else None
        why = verify.not_covered(q0, k0, v0, a, b, ssm_states, slots, query_start_loc, buffer, rows)
    if why is not None:
        serving.passed(VERIFY_STATS, why)
        return engine()
    return serving.attempt(
        VERIFY_STATS, short, v.device,
        lambda: verify.serve(q0, k0, v0, a, b, A_log, dt_bias, ssm_states, slots, query_start_loc, buffer, rows)[None],
        engine)

