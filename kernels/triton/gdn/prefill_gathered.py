"""The gathered-prefill definitions (gdn_prefill_gathered_*, vLLM's convention) served by the Triton
prefill kernels' pool mode: the gathered states are a pool of one slot per sequence (identity slots,
every state an initial one: kdispatch/definitions/gdn/gathered.py), updated in place. Only the
launch configurations that won regions of the pool prefills' routers (H100, 2026-11-27) are
registered: each is a tune pair per workload."""
from __future__ import annotations

from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, all_true, gathered_prefill_name, identity_slots
from kdispatch.kernels.triton.gdn import prefill_chunked, prefill_fused
from kdispatch.registry import variant


def gdn_prefill_gathered_fused(q, k, v, g, beta, initial_state, cu_seqlens, out, scale, cfg=None):
    n = initial_state.shape[0]
    return prefill_fused.gdn_prefill_pool_fused(q, k, v, g, beta, initial_state, identity_slots(n, q.device),
                                                all_true(n, q.device), cu_seqlens, out, scale, cfg=cfg)


def gdn_prefill_gathered_chunked(q, k, v, g, beta, initial_state, cu_seqlens, out, scale, cfg=None):
    n = initial_state.shape[0]
    return prefill_chunked.gdn_prefill_pool_chunked(q, k, v, g, beta, initial_state, identity_slots(n, q.device),
                                                    all_true(n, q.device), cu_seqlens, out, scale, cfg=cfg)


_FUSED = {c: prefill_fused.LAUNCH_CONFIGS[c] for c in ("c16v32", "c16v64")}
_CHUNKED = {c: prefill_chunked.LAUNCH_CONFIGS[c] for c in ("v64",)}
for _hq, _hv in GATHERED_HEADS.values():
    variant(gathered_prefill_name(_hq, _hv), "triton_prefill_fused", backend="triton", archs=("sm90",),
            requires=("triton",), configs=_FUSED, strided=True)(gdn_prefill_gathered_fused)
    variant(gathered_prefill_name(_hq, _hv), "triton_prefill_chunked", backend="triton", archs=("sm90",),
            requires=("triton",), configs=_CHUNKED, strided=True)(gdn_prefill_gathered_chunked)
