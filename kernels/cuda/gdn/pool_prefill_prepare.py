"""The launch before FlashInfer's chunked prefill on a state pool in place (pool_prefill_prepare.cu):
q/k normalised, gates in fp32, fresh sequences' pool rows zeroed, padding sequences made empty and
their tokens neutral, a malformed batch made N empty sequences with its output zeroed; one NVRTC
launch, no host sync, nothing after the library call."""
from __future__ import annotations

from pathlib import Path

import torch

from kdispatch import nvrtc

CU = Path(__file__).with_name("pool_prefill_prepare.cu")
MAX_TOKENS = 32  # PREP_TOKENS in the .cu
THREADS = 256
ROWS_A_BLOCK = 64  # 128-wide rows a token block normalises or copies: two per 8-lane group
SCANS = 1 << 22  # cu_seqlens entries all token blocks read between them (each checks the batch itself)
_kernel = None


def _rows(x: torch.Tensor, name: str) -> tuple[int, int]:
    """(token, head) strides of a [T, H, 128] bf16 view whose rows are 8-byte aligned."""
    st, sh, sd = x.stride()
    if x.dtype != torch.bfloat16 or sd != 1 or (st | sh) & 3 or x.data_ptr() & 7:
        raise ValueError(f"pool prefill prepare: {name} must be bf16 with contiguous, 8-byte aligned rows")
    return st, sh


def prepare(q, k, v, g, beta, pool, slots, has_init, cu_seqlens, out):
    """(q, k, v, alpha, beta, cu_seqlens, slots) for FlashInfer, in buffers of this call; see the .cu."""
    global _kernel
    if _kernel is None:
        _kernel = nvrtc.load_kernel(CU, "gdn_pool_prefill_prepare", signature="p" * 15 + "liiiii" + "l" * 9)
    T, HQ, D = q.shape
    HV, N = v.shape[1], slots.shape[0]
    if D != 128 or pool.dtype != torch.float32 or pool.stride(3) != 1 or any(s & 3 for s in pool.stride()[:3]) \
            or pool.data_ptr() & 15:
        raise ValueError("pool prefill prepare: head size 128, an fp32 pool with 16-byte aligned rows")
    if not out.is_contiguous() or out.dtype != torch.bfloat16 or out.data_ptr() & 15:
        raise ValueError("pool prefill prepare: out must be contiguous, 16-byte aligned bf16")
    if cu_seqlens.dtype != torch.int32 or slots.dtype != torch.int32:
        raise ValueError("pool prefill prepare: int32 cu_seqlens and slots")
    strides = (*_rows(q, "q"), *_rows(k, "k"), *_rows(v, "v"))
    copy_v = not v.is_contiguous()
    dev = q.device
    qk = torch.empty(2, T, HQ, D, dtype=torch.bfloat16, device=dev)
    v_new = torch.empty_like(v, memory_format=torch.contiguous_format) if copy_v else v
    gates = torch.empty(2, T, HV, dtype=torch.float32, device=dev)
    meta = torch.empty(2 * N + 1, dtype=torch.int32, device=dev)
    # enough blocks to stream q/k at small T (the first version, 32 tokens a block, took 60-70 us at
    # 512-2,048 tokens with 32 value heads: H100, 2026-11-27), few enough that their checks stay cheap
    tpb = min(MAX_TOKENS, max(1, ROWS_A_BLOCK // (2 * HQ + (HV if copy_v else 0)), -(-T * (N + 1) // SCANS)))
    blocks = -(-T // tpb) + N * HV + 1
    _kernel.launch(blocks, THREADS, q, k, v, g.contiguous(), beta.contiguous(), pool, slots, has_init, cu_seqlens,
                   out, qk[0], qk[1], v_new if copy_v else None, gates, meta, T, N, HQ, HV, pool.shape[0], tpb, *strides,
                   *pool.stride()[:3], stream=nvrtc.current_stream(dev.index))
    return qk[0], qk[1], v_new, gates[0], gates[1], meta[: N + 1], meta[N + 1:]
