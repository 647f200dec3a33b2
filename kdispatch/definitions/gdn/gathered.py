"""vLLM's prefill convention (definitions gdn_prefill_gathered_*): the names, and the view of its
gathered states as a pool of one slot per sequence that lets the pool-prefill kernels serve it.

vLLM gathers the prefill's states out of its pool (`ssm_state[indices]`, a copy zeroed where a
sequence has no initial state), calls one prefill function on them and scatters the final states
back; the definitions cover that call, so their baseline is FlashInfer as vLLM calls it (no gather
or scatter: vLLM pays those either way). Kept apart from names.py, which every GDN kernel imports:
a change here re-measures only the gathered variants (kdispatch/provenance.py)."""
import torch

from kdispatch.definitions.gdn.names import PACKED_HEADS

GATHERED_HEADS = PACKED_HEADS  # Qwen3-Next-80B per TP degree, as in the pool convention

# device -> buffers, the newest (longest) last, sliced per call: no launch a call, and none is ever
# freed, since a CUDA graph captured with a slice of one keeps reading it
_identity: dict = {}
_all_true: dict = {}


def gathered_prefill_name(hq: int, hv: int) -> str:
    return f"gdn_prefill_gathered_qk{hq}_v{hv}_d128_k_last"


def _prefix(cache: dict, n: int, device, make) -> torch.Tensor:
    bufs = cache.setdefault(device, [])
    if not bufs or bufs[-1].shape[0] < n:
        bufs.append(make(max(n, 256)))
    return bufs[-1][:n]


def identity_slots(n: int, device) -> torch.Tensor:
    """[n] int32 0 .. n-1: a slot per gathered state."""
    return _prefix(_identity, n, device, lambda m: torch.arange(m, dtype=torch.int32, device=device))


def all_true(n: int, device) -> torch.Tensor:
    """[n] bool ones: every gathered state is its sequence's initial state (vLLM zeroed the fresh ones)."""
    return _prefix(_all_true, n, device, lambda m: torch.ones(m, dtype=torch.bool, device=device))
