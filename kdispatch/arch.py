"""Architecture names ("sm90", "sm100", "cpu", "meta") for devices, as routers and variants use them."""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=None)
def _cuda_arch(index: int) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


_BY_DEVICE: dict = {}  # torch.device -> its architecture: reading device.type alone costs ~0.4 us


def arch_of(device) -> str:
    """Architecture of a torch.device (cached per device; no device sync). A device without an
    index ("cuda") follows the current device, so it is not cached."""
    found = _BY_DEVICE.get(device)
    if found is not None:
        return found
    if device.type == "cuda":
        if device.index is None:
            return _cuda_arch(_current_index())
        found = _cuda_arch(device.index)
    else:
        found = device.type
    _BY_DEVICE[device] = found
    return found


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
