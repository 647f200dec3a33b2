"""GDN prefill around a library kernel (prefill_guard.cu): cu_seqlens checked on the device, gates
activated and a malformed batch's output zeroed, in one launch before the call.

A library prefill kernel (FlashInfer's, fla's) trusts cu_seqlens. To keep the definition's rule for a
malformed batch (not 0 = cu[0] <= ... <= cu[N] = T: zero output, every state untouched) without a
host sync:

- `guard(...)` before the call writes the int64 cu_seqlens the library gets (the caller's, int32 or
  int64, when well formed; else, with `malformed="empty"`, all zeros: N empty sequences, whose final
  states are their initial ones, for a library that writes the final states over the initial ones in
  place; or the even partition n * T // N, which any kernel takes safely) and the verdict; with
  `gates` the activated gates FlashInfer wants (fp32 [T, HV] each; torch computed them in eight
  launches), with `log_decay` (engines' pre-activated g) its alpha = exp(g); with `out`, a malformed
  batch's output zeroed (a library given N empty sequences writes none of it). The int64 copy and
  the gates come from this one launch, so a guarded engine call (vLLM's: an int64 conversion and
  exp(g), two launches) takes no more launches than the engine's own.
- `commit(...)` after, where the library returns new final states (fla): state <- final when well
  formed; else state kept and the output zeroed.

CUDA launches through NVRTC rather than Triton: a Triton launch cost 20-60 us of host time a call
on the H100 host, an eager prefill's whole budget (benchmarks/wrapper_overhead.py).
"""
from __future__ import annotations

from pathlib import Path

import torch

from kdispatch import nvrtc

CU = Path(__file__).with_name("prefill_guard.cu")
TOKENS = 32  # tokens a guard block handles (GUARD_TOKENS in the .cu)
THREADS = 256
COMMIT_BLOCKS = 1024  # grid-stride copy: enough blocks to stream the states at full bandwidth

_kernels: dict[str, nvrtc.Kernel] = {}


def _kernel(name: str, signature: str) -> nvrtc.Kernel:
    kern = _kernels.get(name)
    if kern is None:
        kern = _kernels[name] = nvrtc.load_kernel(CU, name, signature=signature)
    return kern


def guard(cu_seqlens, T: int, *, gates: tuple | None = None, log_decay=None, out=None, malformed: str = "even"):
    """(safe cu_seqlens int64 [N + 1], verdict buffer for `commit`, alpha, beta).

    gates: (A_log, a, dt_bias, b) to activate (alpha, beta fp32 [T, HV]).
    log_decay: g fp32 [T, HV] (heads contiguous) for alpha = exp(g) fp32 [T, HV]; beta None.
    Neither: alpha and beta None.
    out: the call's output [T, ...] (contiguous bf16), zeroed here for a malformed batch.
    malformed: what a malformed batch's library call gets, "even" or "empty" sequences."""
    if malformed not in ("even", "empty"):
        raise ValueError(f"prefill guard: malformed must be 'even' or 'empty', got {malformed!r}")
    if gates is not None and log_decay is not None:
        raise ValueError("prefill guard: gates or log_decay, not both")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        cu_seqlens = cu_seqlens.to(torch.int64)
    cu_seqlens = cu_seqlens.contiguous()
    N = cu_seqlens.shape[0] - 1
    device = cu_seqlens.device
    verdict = torch.empty(N + 2, dtype=torch.int64, device=device)  # N + 1 offsets, then ok
    alpha = beta = act = A_log = a = dt_bias = b = None
    hv = s_at = s_bt = s_gt = 0
    if gates is not None:
        A_log, a, dt_bias, b = gates
        hv, s_at, s_bt = a.shape[1], a.stride(0), b.stride(0)
        if a.stride(1) != 1 or b.stride(1) != 1:
            raise ValueError("prefill guard: a and b need contiguous heads")
        act = torch.empty(2, T, hv, dtype=torch.float32, device=device)
        alpha, beta = act[0], act[1]
    elif log_decay is not None:
        if log_decay.dtype != torch.float32 or log_decay.stride(1) != 1:
            raise ValueError("prefill guard: log_decay must be fp32 with contiguous heads")
        hv, s_gt = log_decay.shape[1], log_decay.stride(0)
        act = alpha = torch.empty(T, hv, dtype=torch.float32, device=device)
    out_row = 0
    if out is not None:
        out_row = out.numel() // max(T, 1)
        if not out.is_contiguous() or out.dtype != torch.bfloat16 or out_row % 8 or out.data_ptr() % 16:
            raise ValueError("prefill guard: out must be contiguous, 16-byte aligned bf16, rows of 8k values")
    _kernel("gdn_prefill_guard", "p" * 9 + "liillliii").launch(
        max(-(-T // TOKENS), 1), THREADS, cu_seqlens, verdict, A_log, a, dt_bias, b, log_decay, act, out,
        T, N, hv, s_at, s_bt, s_gt, out_row, int(malformed == "empty"), int(cu_seqlens.dtype == torch.int32),
        stream=nvrtc.current_stream(device.index))
    return verdict[: N + 1], verdict, alpha, beta


def commit(state, final, out, verdict):
    """state <- final and out kept where the guard found the batch well formed; else state kept and
    out zeroed. Returns (out, state)."""
    if not (state.is_contiguous() and out.is_contiguous() and final.shape == state.shape):
        raise ValueError("prefill commit: contiguous state and output, and a final state shaped like state")
    final = final.contiguous()
    n = max(state.numel(), out.numel())
    if n:
        _kernel("gdn_prefill_commit", "pppp" + "ill").launch(
            min(-(-n // THREADS), COMMIT_BLOCKS), THREADS, state, final, out, verdict, verdict.shape[0] - 2,
            state.numel(), out.numel(), stream=nvrtc.current_stream(state.device.index))
    return out, state
