"""A call's floor on this GPU: the bytes and FLOPs its definition's spec says it cannot avoid
(`Spec.floor`), at the device's peak HBM bandwidth and dense FP8 tensor throughput."""
from __future__ import annotations

import torch

from kdispatch import definitions
from kdispatch.workloads import resolve_axes

# Device name substring -> (HBM bytes/s, dense FP8 FLOP/s), from the vendors' data sheets.
PEAKS = {"H100": (3.35e12, 989e12), "H200": (4.8e12, 989e12), "B200": (8.0e12, 2250e12)}


def peaks() -> tuple[float, float]:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return next((v for k, v in PEAKS.items() if k in name), PEAKS["H100"])


def peak_bandwidth() -> float:
    return peaks()[0]


def floor_us(definition: str, args, axes: dict) -> float:
    """The tighter of the memory and the compute bound of one call, in microseconds."""
    d = definitions.get(definition)
    f = d.spec.floor(dict(zip(d.inputs, args)), resolve_axes(d, axes))
    bw, flops = peaks()
    return max(f.bytes / bw, f.flops / flops) * 1e6
