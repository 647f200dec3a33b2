"""The engines' GDN speculative-verify calls served by kdispatch, for the engine plugins: SGLang's
`target_verify` (draft tokens run from each request's slot without committing it, every step's
state cached in a buffer) by `kdispatch.ops.gdn_verify`; vLLM's (a slot per draft step in the pool,
the state read from the accepted step's) by `kdispatch.ops.gdn_verify_steps`.

`not_covered(...)` / `not_covered_steps(...)` say why kdispatch's definitions do not cover a call
(None: they do); `serve(...)` / `serve_steps(...)` run a covered call and return its output, the
states stored in place.
"""
from __future__ import annotations

import torch

from kdispatch.integrations import serving
from kdispatch.integrations.packed_decode import DIM, HEADS, as_fp32


def not_covered(q, k, v, a, b, pool, slots, cu_seqlens, buffer, rows) -> str | None:
    if buffer is None or rows is None:
        return "no intermediate-states buffer, or no cache rows"
    why = serving.layout_not_covered(("verify",), (q, k, v, a, b, pool, slots, cu_seqlens, buffer, rows),
                                     lambda: _layout_not_covered(q, k, v, a, b, pool, slots, cu_seqlens, buffer, rows))
    if why is None and (k.shape[0] != q.shape[0] or slots.shape[0] != cu_seqlens.shape[0] - 1
                        or rows.shape[0] != slots.shape[0]):
        why = (f"{k.shape[0]} keys for {q.shape[0]} tokens, or {slots.shape[0]} slots and {rows.shape[0]} cache rows "
               f"for {cu_seqlens.shape[0] - 1} requests")
    return why or serving.not_served(serving.gdn_short("verify", v.shape[-2]), v.device)


def _layout_not_covered(q, k, v, a, b, pool, slots, cu_seqlens, buffer, rows) -> str | None:
    why = _inputs_not_covered(q, k, v, a, b, pool)
    if why is not None:
        return why
    hv = v.shape[-2]
    if buffer.dtype != torch.float32 or buffer.dim() != 5 or tuple(buffer.shape[2:]) != (hv, DIM, DIM) \
            or not buffer.is_contiguous():
        return "no contiguous fp32 intermediate-states buffer [rows, steps, HV, 128, 128]"
    if any(x.dtype != torch.int32 or x.dim() != 1 for x in (slots, cu_seqlens, rows)):
        return "slots, cache rows and boundaries must be int32 vectors"
    return None


def axes(total_seq_len: int, num_seqs: int, pool, buffer) -> dict:
    """The gdn_verify definitions' variable axes of a call (for `serving.decision`)."""
    return {"total_seq_len": total_seq_len, "num_seqs": num_seqs, "len_cu_seqlens": num_seqs + 1,
            "num_slots": pool.shape[0], "num_cache_rows": buffer.shape[0], "cache_steps": buffer.shape[1]}


def _inputs_not_covered(q, k, v, a, b, pool) -> str | None:
    hv = v.shape[-2] if v.dim() >= 2 else None
    if hv not in HEADS or v.shape[-1] != DIM or q.shape[-2:] != (hv // 2, DIM) or k.shape[1:] != q.shape[1:]:
        return f"q {tuple(q.shape)}, v {tuple(v.shape)} (want {sorted(HEADS)} value heads, half as many q/k, of {DIM})"
    if not all(x.dtype == torch.bfloat16 for x in (q, k, v, a, b)):
        return f"q/k/v of {q.dtype}, gates of {a.dtype}"
    if pool is None or pool.dtype != torch.float32 or pool.dim() != 4 or tuple(pool.shape[1:]) != (hv, DIM, DIM):
        return f"state pool {None if pool is None else (pool.dtype, tuple(pool.shape))}"
    if any(x.stride(-1) != 1 for x in (q, k, v, a, b, pool)):
        return "an input whose last dimension is strided"
    return None


def not_covered_steps(q, k, v, a, b, pool, step_slots, accepted, cu_seqlens) -> str | None:
    why = serving.layout_not_covered(("verify_steps",), (q, k, v, a, b, pool, step_slots, accepted, cu_seqlens),
                                     lambda: _steps_layout_not_covered(q, k, v, a, b, pool, step_slots, accepted,
                                                                       cu_seqlens))
    if why is None and (k.shape[0] != q.shape[0] or step_slots.shape[0] != accepted.shape[0]
                        or cu_seqlens.shape[0] != accepted.shape[0] + 1):
        why = (f"{k.shape[0]} keys for {q.shape[0]} tokens, or step slots {tuple(step_slots.shape)}, "
               f"{accepted.shape[0]} counts, {cu_seqlens.shape[0]} boundaries")
    return why or serving.not_served(serving.gdn_short("verify_steps", v.shape[-2]), v.device)


def _steps_layout_not_covered(q, k, v, a, b, pool, step_slots, accepted, cu_seqlens) -> str | None:
    why = _inputs_not_covered(q, k, v, a, b, pool)
    if why is not None:
        return why
    if any(x.dtype != torch.int32 for x in (step_slots, accepted, cu_seqlens)) or accepted.dim() != 1 \
            or cu_seqlens.dim() != 1:
        return "step slots, accepted counts and boundaries must be int32"
    if step_slots.dim() != 2 or step_slots.stride(1) != 1:
        return f"step slots {tuple(step_slots.shape)}"
    return None


def serve_steps(q, k, v, a, b, A_log, dt_bias, pool, step_slots, accepted, cu_seqlens, scale=None) -> torch.Tensor:
    import kdispatch.ops

    out, _ = kdispatch.ops.gdn_verify_steps(q, k, v, a, b, as_fp32(A_log), as_fp32(dt_bias), pool, step_slots,
                                            accepted, cu_seqlens, scale)
    return out


def serve(q, k, v, a, b, A_log, dt_bias, pool, slots, cu_seqlens, buffer, rows, scale=None) -> torch.Tensor:
    import kdispatch.ops

    out, _ = kdispatch.ops.gdn_verify(q, k, v, a, b, as_fp32(A_log), as_fp32(dt_bias), pool, slots, cu_seqlens,
                                      buffer, rows, scale)
    return out
