"""The gathered-prefill definitions (gdn_prefill_gathered_*, vLLM's convention) served by the CUDA
recurrence's pool mode: the gathered states are a pool of one slot per sequence (identity slots,
every state an initial one: kdispatch/definitions/gdn/gathered.py), updated in place. Only the
launch configurations that won regions of the pool prefills' routers (H100, 2026-11-27) are
registered: each is a tune pair per workload."""
from __future__ import annotations

from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, all_true, gathered_prefill_name, identity_slots
from kdispatch.kernels.cuda.gdn import prefill_thread_rows
from kdispatch.registry import variant


def gdn_prefill_gathered_rows(q, k, v, g, beta, initial_state, cu_seqlens, out, scale, cfg=None):
    n = initial_state.shape[0]
    return prefill_thread_rows.gdn_prefill_pool_rows(q, k, v, g, beta, initial_state, identity_slots(n, q.device),
                                                     all_true(n, q.device), cu_seqlens, out, scale, cfg=cfg)


_ROWS = {c: prefill_thread_rows.LAUNCH_CONFIGS[c] for c in ("k2c8", "k4c8", "k8c8", "k16c8")}
for _hq, _hv in GATHERED_HEADS.values():
    variant(gathered_prefill_name(_hq, _hv), "cuda_prefill_pool_rows", backend="cuda", archs=("sm90",),
            requires=("cuda.core",), configs=_ROWS,
            supports=prefill_thread_rows._short_enough, strided=True)(gdn_prefill_gathered_rows)
