"""Gather and scatter of pool states around a library prefill kernel (pool_states.cu): what SGLang
does on Hopper around FlashInfer's chunked prefill (`ssm_states[idx]`, `index_copy_`), with any slot
value safe (padding: zeros in, nothing out, its output rows zeroed) and nothing written back for a
batch the prefill guard found malformed. One NVRTC launch each, no host sync."""
from __future__ import annotations

from pathlib import Path

import torch

from kdispatch import nvrtc

CU = Path(__file__).with_name("pool_states.cu")
THREADS = 256
_kernels: dict[str, nvrtc.Kernel] = {}


def _kernel(name: str, signature: str) -> nvrtc.Kernel:
    kern = _kernels.get(name)
    if kern is None:
        kern = _kernels[name] = nvrtc.load_kernel(CU, name, signature=signature)
    return kern


def _strides(pool: torch.Tensor) -> tuple[int, int, int]:
    sp = pool.stride()
    if (sp[0] | sp[1] | sp[2]) & 3 or sp[3] != 1 or pool.data_ptr() & 15:
        raise ValueError("pool states: the pool needs 16-byte aligned slots, heads and rows")
    return sp[0], sp[1], sp[2]


def gather(pool, slots, has_init) -> torch.Tensor:
    """[N, HV, 128, 128] fp32: each sequence's initial state (zeros for padding or no has_init)."""
    N, HV = slots.shape[0], pool.shape[1]
    states = torch.empty(N, *pool.shape[1:], dtype=torch.float32, device=pool.device)
    if N:
        _kernel("gdn_pool_gather", "pppp" + "ii" + "lll").launch(
            N * HV, THREADS, pool, slots, has_init, states, HV, pool.shape[0], *_strides(pool),
            stream=nvrtc.current_stream(pool.get_device()))
    return states


def scatter(pool, slots, states, initial, verdict, cu, out) -> None:
    """pool[slot] <- states[n] for live slots when verdict[-1] (the guard's) says well formed, or
    initial[n] (what `gather` returned) for an empty sequence, whose final state a library leaves
    unwritten; zeroes the output rows [T, HV, 128] (contiguous bf16) of padding sequences, between
    the safe `cu`."""
    N, HV = slots.shape[0], pool.shape[1]
    if not out.is_contiguous() or out.dtype != torch.bfloat16:
        raise ValueError("pool states: out must be contiguous bf16")
    if N:
        _kernel("gdn_pool_scatter", "ppppppp" + "ii" + "lll").launch(
            N * HV, THREADS, pool, slots, states.contiguous(), initial.contiguous(), verdict[-1:], cu, out, HV,
            pool.shape[0],
            *_strides(pool), stream=nvrtc.current_stream(pool.get_device()))
