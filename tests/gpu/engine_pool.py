"""Helpers of the engine-convention GPU tests (packed decode, pool prefill, verify): inputs of a
definition for given axes, a variant or a skip saying why it does not run here, and a state pool
laid out as the engines keep it (each slot inside a larger page, so the slot pitch exceeds a slot)."""
import pytest
import torch

from kdispatch import arch, registry
from kdispatch.workloads import materialize


def args_for(definition: str, axes: dict, seed: int = 0) -> list:
    w = {"axes": axes, "inputs": {}, "uuid": f"{definition}-gpu-{'-'.join(map(str, axes.values()))}"}
    return list(materialize(definition, w, device="cuda", seed=seed))


def runnable(definition: str, name: str):
    v = registry.get(definition, name)
    why = v.why_not(arch.local_arch())
    if why:
        pytest.skip(f"{name}: {why}")
    return v


def paged(pool: torch.Tensor, pad: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """(pages [slots, slot + pad], a view of them shaped and valued like `pool`): each slot at the
    start of its page, the rest of each page zeros that no variant may write."""
    slot = pool[0].numel()
    pages = torch.zeros(pool.shape[0], slot + pad, device=pool.device)
    pages[:, :slot] = pool.reshape(pool.shape[0], -1)
    return pages, pages.as_strided(pool.shape, (slot + pad, *pool.stride()[1:]))


def untouched_margins(pages: torch.Tensor, slot: int) -> bool:
    return torch.equal(pages[:, slot:], torch.zeros_like(pages[:, slot:]))
