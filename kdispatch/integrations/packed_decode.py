"""The engines' packed GDN decode call (SGLang's and vLLM's `fused_recurrent_gated_delta_rule_packed_decode`
contract) served by `kdispatch.ops.gdn_decode_packed`, shared by the engine plugins.

`not_covered(...)` says why kdispatch's definitions do not cover a call (None: they do); `serve(...)`
runs a covered call, writing the output into `out` and the states into the pool in place.
"""
from __future__ import annotations

import weakref

import torch

from kdispatch import dispatch
from kdispatch.integrations import serving
from kdispatch.integrations.serving import HEADS  # value heads (q/k heads: half)
DIM = 128
_fp32: dict = {}  # id of a layer's A_log / dt_bias -> (weak reference, version, its float32 copy)


def not_covered(mixed_qkv, a, b, pool, slots, num_v_heads: int, head_v_dim: int) -> str | None:
    """Why kdispatch's definitions do not cover a packed decode call (None: they do)."""
    why = serving.layout_not_covered(
        ("decode_packed", num_v_heads, head_v_dim), (mixed_qkv, a, b, pool, slots),
        lambda: _layout_not_covered(mixed_qkv, a, b, pool, slots, num_v_heads, head_v_dim))
    return why or serving.not_served(serving.gdn_short("decode_packed", num_v_heads), mixed_qkv.device)


def _layout_not_covered(mixed_qkv, a, b, pool, slots, num_v_heads: int, head_v_dim: int) -> str | None:
    if num_v_heads not in HEADS or head_v_dim != DIM:
        return f"{num_v_heads} value heads of {head_v_dim}"
    if mixed_qkv.dtype != torch.bfloat16 or a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
        return f"rows of {mixed_qkv.dtype}, gates of {a.dtype}"
    if mixed_qkv.dim() != 2 or mixed_qkv.shape[1] != 2 * num_v_heads * DIM:
        return f"packed rows {tuple(mixed_qkv.shape)} (want [B, {2 * num_v_heads * DIM}])"
    if pool.dtype != torch.float32 or pool.dim() != 4 or tuple(pool.shape[1:]) != (num_v_heads, DIM, DIM):
        return f"state pool {pool.dtype} {tuple(pool.shape)}"
    if slots.dtype != torch.int32 or slots.dim() != 1:
        return f"slot indices {slots.dtype} of {slots.dim()} dims"
    if mixed_qkv.stride(-1) != 1 or a.stride(-1) != 1 or b.stride(-1) != 1 or pool.stride(-1) != 1:
        return "an input whose last dimension is strided"
    return None


def axes(batch_size: int, pool) -> dict:
    """The gdn_decode_packed definitions' variable axes of a call (for `serving.decision`)."""
    return {"batch_size": batch_size, "num_slots": pool.shape[0]}


def as_fp32(t: torch.Tensor) -> torch.Tensor:
    """A layer parameter (A_log, dt_bias) as float32, the definitions' dtype: converted once per
    tensor and version (a parameter loaded in place is converted again; a tensor that died is never
    mistaken for a new one at its address). A conversion made while a CUDA graph is captured is not
    kept: its result exists only when the graph replays, and later eager calls would read it unset."""
    if t.dtype == torch.float32:
        return t
    held = _fp32.get(id(t))
    if held is None or held[0]() is not t or held[1] != t._version:
        fp32 = t.float().contiguous()
        if dispatch.capturing():
            return fp32
        held = _fp32[id(t)] = (weakref.ref(t), t._version, fp32)
    return held[2]


def serve(mixed_qkv, a, b, A_log, dt_bias, scale, pool, slots, out) -> None:
    import kdispatch.ops

    kdispatch.ops.gdn_decode_packed(mixed_qkv, a, b, as_fp32(A_log), as_fp32(dt_bias), pool, slots, out, scale)
