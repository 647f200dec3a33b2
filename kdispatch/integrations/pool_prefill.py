"""The engines' GDN prefill calls served by kdispatch, for the engine plugins: SGLang's `extend` over
its state pool (q/k/v [1, T, H, 128] split out of one projection, gates activated by the engine,
int32 slots and boundaries: `kdispatch.ops.gdn_prefill_pool`) and vLLM's prefill call on the states
it gathered (`kdispatch.ops.gdn_prefill_gathered`).

`not_covered(...)` says why kdispatch's definitions do not cover a call (None: they do); `serve(...)`
/ `serve_gathered(...)` run a covered call, writing the output into `out` and the final states into
the pool (the gathered states) in place.
"""
from __future__ import annotations

import torch

from kdispatch.integrations import serving
from kdispatch.integrations.packed_decode import DIM, HEADS
from kdispatch.ops import prefill_scale

_batch: dict = {"lengths": None}  # (sequences, longest sequence) of the batch the engine runs, from its metadata


def not_covered(q, k, v, g, beta, pool, slots, cu_seqlens, pool_dtypes=(torch.float32,),
                kind: str = "prefill_pool") -> str | None:
    """Why the `kind` definitions ("prefill_pool", "prefill_gathered": the states one per sequence,
    `slots` None) do not cover the call (None: they do); `pool_dtypes` the pool dtypes the caller
    accepts (one it converts to fp32 itself). Asked on every prefill call, of a new token count
    nearly every time: the layout is checked once (`serving.layout_not_covered`), the counts here."""
    tensors = (q, k, v, g, beta, pool, cu_seqlens) if slots is None else (q, k, v, g, beta, pool, cu_seqlens, slots)
    why = serving.layout_not_covered((kind, pool_dtypes, slots is None), tensors,
                                     lambda: _layout_not_covered(q, k, v, g, beta, pool, slots, cu_seqlens, pool_dtypes))
    if why is None:
        t = q.shape[0]
        if k.shape[0] != t or v.shape[0] != t or g.shape[0] != t or beta.shape[0] != t:
            why = f"q/k/v/g/beta of {q.shape[0]}/{k.shape[0]}/{v.shape[0]}/{g.shape[0]}/{beta.shape[0]} tokens"
        elif slots is not None and slots.shape[0] != cu_seqlens.shape[0] - 1:
            why = f"{slots.shape[0]} slots for {cu_seqlens.shape[0] - 1} sequences"
    return why or serving.not_served(serving.gdn_short(kind, v.shape[-2]), v.device)


def _layout_not_covered(q, k, v, g, beta, pool, slots, cu_seqlens, pool_dtypes) -> str | None:
    hv = v.shape[-2] if v.dim() == 3 else None
    if hv not in HEADS or v.shape[-1] != DIM or q.shape[1:] != (hv // 2, DIM) or k.shape[1:] != q.shape[1:]:
        return f"q {tuple(q.shape)}, v {tuple(v.shape)} (want {sorted(HEADS)} value heads, half as many q/k, of {DIM})"
    bf16, fp32 = torch.bfloat16, torch.float32
    if q.dtype != bf16 or k.dtype != bf16 or v.dtype != bf16 or g.dtype != fp32 or beta.dtype != fp32:
        return f"q/k/v of {q.dtype}, gates of {g.dtype}"
    if g.dim() != 2 or beta.dim() != 2 or g.shape[1] != hv or beta.shape[1] != hv:
        return f"gates {tuple(g.shape)} / {tuple(beta.shape)} (want [T, {hv}])"
    if pool.dtype not in pool_dtypes or pool.dim() != 4 or pool.shape[1:] != (hv, DIM, DIM):
        return f"state pool {pool.dtype} {tuple(pool.shape)}"
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
        return f"boundaries {cu_seqlens.dtype} of {cu_seqlens.dim()} dims"
    if slots is not None and (slots.dtype != torch.int32 or slots.dim() != 1):
        return f"slots {slots.dtype} of {slots.dim()} dims"
    if (q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1 or pool.stride(-1) != 1
            or not (g.is_contiguous() and beta.is_contiguous())):
        return "an input whose last dimension is strided, or strided gates"
    return None


def axes(total_seq_len: int, num_seqs: int, pool=None, max_seq_len: int | None = None) -> dict:
    """The prefill definitions' variable axes of a call (the pool's slots for gdn_prefill_pool; no
    pool: gdn_prefill_gathered), and its longest sequence where the engine told it (for
    `serving.decision`)."""
    out = {"total_seq_len": total_seq_len, "num_seqs": num_seqs, "len_cu_seqlens": num_seqs + 1}
    if pool is not None:
        out["num_slots"] = pool.shape[0]
    return out if max_seq_len is None else {**out, "max_seq_len": max_seq_len}


def note_batch(num_seqs: int, longest: int | None) -> None:
    """Keeps the running batch's sequence count and longest sequence, as the engine's metadata has
    them on the host (no sync), for its prefill calls (`batch_longest`); nothing known: (0, None)."""
    _batch["lengths"] = (num_seqs, int(longest)) if num_seqs and longest else None


def batch_longest(num_seqs: int) -> int | None:
    """The noted batch's longest sequence, if its sequence count is this call's (else None)."""
    lengths = _batch["lengths"]
    return lengths[1] if lengths is not None and lengths[0] == num_seqs else None


def serve(short, features, strided, variant, q, k, v, g, beta, pool, slots, has_initial_state, cu_seqlens, out,
          scale=None) -> None:
    """gdn_prefill_pool's `short` on a call `not_covered` passed, by the `variant` that
    `serving.decision` named for `features` (`axes`) and `strided` (`serving.serve_decided`)."""
    serving.serve_decided(short, v.device, features, strided, (q, k, v, g, beta, pool, slots, has_initial_state,
                                                               cu_seqlens, out, prefill_scale(scale)), variant)


def serve_gathered(short, features, strided, variant, q, k, v, g, beta, states, cu_seqlens, out, scale=None) -> None:
    """gdn_prefill_gathered's `short`, as `serve`."""
    serving.serve_decided(short, v.device, features, strided, (q, k, v, g, beta, states, cu_seqlens, out,
                                                               prefill_scale(scale)), variant)
