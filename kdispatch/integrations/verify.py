"""The engines' GDN speculative-verify call (SGLang's `target_verify`: draft tokens run from each
request's slot without committing it, every step's state cached) served by `kdispatch.ops.gdn_verify`,
for the engine plugins.

`not_covered(...)` says why kdispatch's definitions do not cover a call (None: they do); `serve(...)`
runs a covered call and returns its output, the states stored into the buffer in place.
"""
from __future__ import annotations

import torch

from kdispatch.integrations.packed_decode import DIM, HEADS, as_fp32


def not_covered(q, k, v, a, b, pool, slots, cu_seqlens, buffer, rows) -> str | None:
    hv = v.shape[-2] if v.dim() >= 2 else None
    if hv not in HEADS or v.shape[-1] != DIM or q.shape[-2:] != (hv // 2, DIM) or k.shape != q.shape:
        return f"q {tuple(q.shape)}, v {tuple(v.shape)} (want {sorted(HEADS)} value heads, half as many q/k, of {DIM})"
    if not all(x.dtype == torch.bfloat16 for x in (q, k, v, a, b)):
        return f"q/k/v of {q.dtype}, gates of {a.dtype}"
    if pool.dtype != torch.float32 or pool.dim() != 4 or tuple(pool.shape[1:]) != (hv, DIM, DIM):
        return f"state pool {pool.dtype} {tuple(pool.shape)}"
    if buffer is None or buffer.dtype != torch.float32 or buffer.dim() != 5 or tuple(buffer.shape[2:]) != (hv, DIM, DIM) \
            or not buffer.is_contiguous():
        return "no contiguous fp32 intermediate-states buffer [rows, steps, HV, 128, 128]"
    if any(x is None or x.dtype != torch.int32 or x.dim() != 1 for x in (slots, cu_seqlens, rows)):
        return "slots, cache rows and boundaries must be int32 vectors"
    if slots.shape[0] != cu_seqlens.shape[0] - 1 or rows.shape[0] != slots.shape[0]:
        return f"{slots.shape[0]} slots and {rows.shape[0]} cache rows for {cu_seqlens.shape[0] - 1} requests"
    if any(x.stride(-1) != 1 for x in (q, k, v, a, b, pool)):
        return "an input whose last dimension is strided"
    return None


def serve(q, k, v, a, b, A_log, dt_bias, pool, slots, cu_seqlens, buffer, rows, scale=None) -> torch.Tensor:
    import kdispatch.ops

    out, _ = kdispatch.ops.gdn_verify(q, k, v, a, b, as_fp32(A_log), as_fp32(dt_bias), pool, slots, cu_seqlens,
                                      buffer, rows, scale)
    return out
