"""Architecture names ("sm90", "sm100", "cpu", "meta") for devices, as routers and variants use them;
a CUDA device's also names its GPU model, for the routers fitted on one model's measurements."""
from __future__ import annotations

import re
from functools import lru_cache


class Arch(str):
    """An architecture name ("sm90") that also names its device's model (`model`: the GPU's
    `device_module` name, or None): where routers/<arch>/<model>/ has a router fitted on that model's
    measurements alone, it serves the device (`Dispatcher.router`); everything else sees the name."""

    model: str | None

    def __new__(cls, name: str, model: str | None = None):
        self = super().__new__(cls, name)
        self.model = model
        return self


def device_module(name: str) -> str:
    """The router package of a device model: 'NVIDIA H100 80GB HBM3' -> 'nvidia_h100_80gb_hbm3'."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "unknown"


@lru_cache(maxsize=None)
def _cuda_arch(index: int) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return Arch(f"sm{major}{minor}", device_module(torch.cuda.get_device_name(index)))


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
