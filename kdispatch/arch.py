"""Architecture names ("sm90", "sm100", "cpu", "meta") for devices, as routers and variants use them."""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=None)
def _cuda_arch(index: int) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


def arch_of(device) -> str:
    """Architecture of a torch.device (cached per CUDA device index; no device sync)."""
    if device.type == "cuda":
        return _cuda_arch(device.index if device.index is not None else _current_index())
    return device.type


def _current_index() -> int:
    import torch

    return torch.cuda.current_device()


def local_arch() -> str:
    """Architecture of this machine's current CUDA device, or "cpu" without one."""
    try:
        import torch

        if torch.cuda.is_available():
            return _cuda_arch(torch.cuda.current_device())
    except ImportError:
        pass
    return "cpu"
