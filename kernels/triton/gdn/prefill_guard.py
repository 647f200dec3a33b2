"""GDN prefill around a library kernel: cu_seqlens checked on the device, gates activated in the same launch.

A library prefill kernel (FlashInfer's, fla's) trusts cu_seqlens. To keep the definition's rule for a
malformed batch (not 0 = cu[0] <= ... <= cu[N] = T: zero output, every state untouched) without a
host sync, the call is bracketed by two launches:

- `guard(...)` before: checks cu_seqlens, writes the cu_seqlens the library gets (the caller's when
  well formed, else the even partition n * T // N, which any kernel takes safely, or with
  `malformed="empty"` all zeros: N empty sequences, whose final states are their initial ones, for a
  library that writes the final states over the initial ones in place) and a device flag;
  with `gates=True` it also writes the activated gates FlashInfer wants (alpha = exp(-exp(A_log) *
  softplus(a + dt_bias)) and beta = sigmoid(b), fp32 [T, HV]), which torch computed in eight launches.
- `commit(...)` after: copies the library's final states into `state` and, for a malformed batch,
  leaves `state` as it was and zeroes the output (the one state copy the in-place contract already
  cost); with no separate final states (written in place) it only zeroes a malformed batch's output.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

GATE_TOKENS = 64  # tokens a guard program activates
COMMIT_BLOCK = 4096  # elements a commit program copies or zeroes


@triton.jit
def _cu_ok(cu_ptr, T, N, BLOCK_CU: tl.constexpr):
    offs = tl.arange(0, BLOCK_CU)
    cu = tl.load(cu_ptr + offs, mask=offs <= N, other=0)
    prev = tl.load(cu_ptr + offs - 1, mask=(offs >= 1) & (offs <= N), other=0)
    bad = ((offs == 0) & (cu != 0)) | ((offs <= N) & (cu < prev)) | ((offs == N) & (cu != T))
    return tl.sum(bad.to(tl.int32), axis=0) == 0, cu, offs


@triton.jit
def _guard_kernel(cu_ptr, safe_cu_ptr, ok_ptr, A_log_ptr, a_ptr, dt_bias_ptr, b_ptr, alpha_ptr, beta_ptr,
                  T, N, s_at, s_bt,
                  HV: tl.constexpr, BLOCK_CU: tl.constexpr, BT: tl.constexpr, GATES: tl.constexpr,
                  EMPTY: tl.constexpr):
    pid = tl.program_id(0)
    if pid == 0:
        ok, cu, offs = _cu_ok(cu_ptr, T, N, BLOCK_CU)
        if EMPTY:
            fallback = offs.to(tl.int64) * 0
        else:
            fallback = offs.to(tl.int64) * T // tl.maximum(N, 1)
        tl.store(safe_cu_ptr + offs, tl.where(ok, cu, fallback), mask=offs <= N)
        tl.store(ok_ptr, ok.to(tl.int32))
    if GATES:
        t = pid * BT + tl.arange(0, BT)[:, None]
        h = tl.arange(0, HV)[None, :]
        live = t < T
        x = tl.load(a_ptr + t * s_at + h, mask=live, other=0.0).to(tl.float32) + tl.load(dt_bias_ptr + h)
        softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        tl.store(alpha_ptr + t * HV + h, tl.exp(-tl.exp(tl.load(A_log_ptr + h)) * softplus), mask=live)
        b = tl.load(b_ptr + t * s_bt + h, mask=live, other=0.0).to(tl.float32)
        tl.store(beta_ptr + t * HV + h, 1.0 / (1.0 + tl.exp(-b)), mask=live)


@triton.jit
def _commit_kernel(state_ptr, final_ptr, out_ptr, ok_ptr, n_state, n_out, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    ok = tl.load(ok_ptr)
    n_state_blocks = tl.cdiv(n_state, BLOCK)
    offs = tl.arange(0, BLOCK).to(tl.int64)
    if pid < n_state_blocks:
        i = pid.to(tl.int64) * BLOCK + offs
        m = i < tl.where(ok != 0, n_state, 0)
        tl.store(state_ptr + i, tl.load(final_ptr + i, mask=m), mask=m)
    else:
        i = (pid - n_state_blocks).to(tl.int64) * BLOCK + offs
        m = i < tl.where(ok == 0, n_out, 0)
        tl.store(out_ptr + i, tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty), mask=m)


def guard(cu_seqlens, T: int, *, gates: bool = False, A_log=None, a=None, dt_bias=None, b=None,
          malformed: str = "even"):
    """(safe cu_seqlens int64 [N + 1], ok flag int32 [1], alpha, beta); alpha and beta (fp32 [T, HV])
    are None unless `gates`. `malformed`: what a malformed batch's library call gets, "even" or
    "empty" sequences (see the module docstring)."""
    if malformed not in ("even", "empty"):
        raise ValueError(f"prefill guard: malformed must be 'even' or 'empty', got {malformed!r}")
    N = cu_seqlens.shape[0] - 1
    device = cu_seqlens.device
    safe = torch.empty(N + 1, dtype=torch.int64, device=device)
    ok = torch.empty(1, dtype=torch.int32, device=device)
    alpha = beta = None
    hv = 1
    if gates:
        hv = a.shape[1]
        alpha = torch.empty(T, hv, dtype=torch.float32, device=device)
        beta = torch.empty(T, hv, dtype=torch.float32, device=device)
    a_ = a if gates else ok
    b_ = b if gates else ok
    programs = triton.cdiv(T, GATE_TOKENS) if gates else 1
    _guard_kernel[(max(programs, 1),)](
        cu_seqlens, safe, ok, A_log if gates else ok, a_, dt_bias if gates else ok, b_,
        alpha if gates else ok, beta if gates else ok, T, N,
        a_.stride(0) if gates else 0, b_.stride(0) if gates else 0,
        HV=hv, BLOCK_CU=triton.next_power_of_2(N + 1), BT=GATE_TOKENS, GATES=gates, EMPTY=malformed == "empty",
        num_warps=4)
    return safe, ok, alpha, beta


def commit(state, final, out, ok):
    """state <- final and out kept, where the guard found the batch well formed; else state kept and
    out zeroed. `final` None: the library wrote the final states into `state` itself. Returns (out, state)."""
    if not (state.is_contiguous() and out.is_contiguous()) or (final is not None and final.shape != state.shape):
        raise ValueError("prefill commit: contiguous state and output, and a final state shaped like state")
    final = state if final is None else final.contiguous()
    n_state, n_out = (0 if final is state else state.numel()), out.numel()
    grid = triton.cdiv(n_state, COMMIT_BLOCK) + triton.cdiv(n_out, COMMIT_BLOCK)
    if grid:
        _commit_kernel[(grid,)](state, final, out, ok, n_state, n_out, BLOCK=COMMIT_BLOCK, num_warps=4)
    return out, state
