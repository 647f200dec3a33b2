"""FlashQLA's chunked GDN prefill (TileLang, warp-specialised; flash-qla 0.1.3 on tilelang 0.1.15,
staged by benchmarks/stage_flashqla.sh): a peer variant of the contest prefill, of the gathered
(vLLM) prefills and of the pool (SGLang) prefills, never the baseline. fla-core 0.6 hands its chunked prefill to FlashQLA on Hopper
when it is installed and given activated gates; here it is called directly.

FlashQLA takes the log decay g and beta activated, states [N, HV, V, K] (`state_v_first`), and
returns a new output and new final states; so the prefill guard (kernels/cuda/gdn/prefill_guard.py)
checks cu_seqlens on the device first (and, for the contest's raw gates, activates them in the same
launch; g = log(alpha)), and its commit copies the final states over the caller's (the in-place
contract) where the batch was well formed, else keeps them and zeroes the output. On a pool, the
slots' states are gathered and the finals scattered back as SGLang does around FlashInfer
(kernels/cuda/gdn/pool_states.py: padding slots read as zeros and never written, their output rows
zeroed, nothing written back for a malformed batch), and FlashQLA normalises q/k itself.

Called with FlashQLA's defaults, intra-card context parallelism included (`auto_cp`: long sequences
split across more CTAs, which is where its published gains over FlashInfer are). FlashQLA reads
cu_seqlens on the host (its chunk offsets, and the CP decision), so a call syncs and is not expected
to survive graph capture: the tuner then routes only eager calls to it, as engines run prefill.
"""
from __future__ import annotations

import torch

from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, gathered_prefill_name
from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.kernels.cuda.gdn import pool_states, prefill_guard
from kdispatch.registry import variant

_QLA = dict(backend="library", archs=("sm90",), requires=("flash_qla", "tilelang", "cuda.core"))


def _run(q, k, v, g, beta, state, cu, scale, normalise=False):
    from flash_qla import chunk_gated_delta_rule

    o, final = chunk_gated_delta_rule(q[None], k[None], v[None], g[None], beta[None], scale=scale or None,
                                      initial_state=state, output_final_state=True, cu_seqlens=cu,
                                      use_qk_l2norm_in_kernel=normalise, state_v_first=True)
    return o[0], final


@variant("gdn_prefill", "flashqla_chunk", **_QLA)
def gdn_prefill_flashqla(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    if q.shape[0] == 0 or state.shape[0] == 0:  # FlashQLA needs a token and a sequence
        return torch.zeros_like(v), state
    cu, verdict, alpha, beta = prefill_guard.guard(cu_seqlens, q.shape[0], gates=(A_log, a, dt_bias, b))
    o, final = _run(q, k, v, torch.log(alpha), beta, state, cu, scale)
    return prefill_guard.commit(state, final, o, verdict)


def gdn_prefill_gathered_flashqla(q, k, v, g, beta, initial_state, cu_seqlens, out, scale):
    if q.shape[0] == 0 or initial_state.shape[0] == 0:
        return out.zero_(), initial_state
    cu, verdict, _, _ = prefill_guard.guard(cu_seqlens, q.shape[0])
    o, final = _run(q, k, v, g, beta, initial_state, cu, scale)
    return prefill_guard.commit(initial_state, final, out.copy_(o), verdict)


for _hq, _hv in GATHERED_HEADS.values():
    variant(gathered_prefill_name(_hq, _hv), "flashqla_chunk", **_QLA)(gdn_prefill_gathered_flashqla)


def gdn_prefill_pool_flashqla(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out,
                              scale):
    T = q.shape[0]
    if T == 0 or state_indices.shape[0] == 0:  # no sequence runs: fresh slots keep their rows (no step)
        return out.zero_(), state_pool
    cu, verdict, _, _ = prefill_guard.guard(cu_seqlens, T)  # malformed: the even partition, nothing kept
    initial = pool_states.gather(state_pool, state_indices, has_initial_state)
    o, final = _run(q, k, v, g, beta, initial, cu, scale, normalise=True)
    out.copy_(torch.where(verdict[-1] != 0, o, torch.zeros((), dtype=o.dtype, device=o.device)))
    pool_states.scatter(state_pool, state_indices, final, initial, verdict, cu, out)
    return out, state_pool


for _hq, _hv in PACKED_HEADS.values():
    variant(pool_prefill_name(_hq, _hv), "flashqla_chunk", **_QLA)(gdn_prefill_pool_flashqla)
