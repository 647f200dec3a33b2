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
    try:
        v = registry.get(definition, name)
    except KeyError:  # a variant not offered at every head count (cuda_prefill_cp)
        pytest.skip(f"{name}: not registered for {definition}")
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


def reference(definition: str, args: list):
    """The definition's reference on copies of the arguments."""
    return registry.get(definition, "reference").fn(*[x.clone() if torch.is_tensor(x) else x for x in args])


def check_prefill(got, want, states=None):
    """A prefill's (output, states) against the reference's, at the spec's tolerance (5e-2); `states`
    where a graph replay wrote them (got's then stale)."""
    (out, new_states), (want_out, want_states) = got, want
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), want_out.float(), rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(new_states if states is None else states, want_states, rtol=5e-2, atol=5e-2)
