"""Pool slot indices with every value outside [0, num_slots) replaced by -1 (slot_guard.cu), for a
library kernel that treats only negative slots as padding. One NVRTC launch where torch.where took
two (about 2-3 us more in a CUDA graph, measured beside SGLang's decode on an H100). `verify_guard`
does the same, and the boundaries, for SGLang's speculative-verify kernel."""
from __future__ import annotations

from pathlib import Path

import torch

from kdispatch import nvrtc

CU = Path(__file__).with_name("slot_guard.cu")
THREADS = 256
_kernel = None


def safe_slots(slots: torch.Tensor, num_slots: int) -> torch.Tensor:
    """int32 [B] -> a new int32 [B]: the slots, -1 where outside [0, num_slots)."""
    global _kernel
    if _kernel is None:
        _kernel = nvrtc.load_kernel(CU, "gdn_slot_guard", signature="ppii")
    safe = torch.empty_like(slots)
    n = slots.shape[0]
    if n:
        _kernel.launch((n + THREADS - 1) // THREADS, THREADS, slots, safe, n, num_slots,
                       stream=nvrtc.current_stream(slots.get_device()))
    return safe


_verify = None


def verify_guard(slots, rows, cu_seqlens, T: int, num_slots: int, num_rows: int, steps: int):
    """(safe slots [N], safe cache rows [N], safe cu_seqlens [N + 1]), int32, for SGLang's verify
    kernel: slots and rows outside their tensors -1, a row -1 for a request longer than `steps`,
    malformed boundaries replaced by the even partition (slot_guard.cu, one launch)."""
    global _verify
    if _verify is None:
        _verify = nvrtc.load_kernel(CU, "gdn_verify_guard", signature="pppppp" + "il" + "iii")
    n = slots.shape[0]
    if cu_seqlens.dtype != torch.int32 or slots.dtype != torch.int32 or rows.dtype != torch.int32:
        raise ValueError("verify guard: int32 slots, cache rows and cu_seqlens")
    safe = torch.empty(3 * n + 1, dtype=torch.int32, device=slots.device)
    _verify.launch(1, 1024, slots, rows, cu_seqlens, safe[:n], safe[n:2 * n], safe[2 * n:], n, T, num_slots,
                   num_rows, steps, stream=nvrtc.current_stream(slots.get_device()))
    return safe[:n], safe[n:2 * n], safe[2 * n:]
