"""FlashMLA's sparse MLA prefill kernel (`flash_mla_sparse_fwd`, sgl-flash-mla 1.0.0, its legacy sm_90
kernels) as SGLang and vLLM call it on Hopper for DeepSeek-V3.2's sparse attention: the baseline of
dsa_sparse_attention on sm_90 where it imports (staged with SGLang by benchmarks/stage_engines.sh;
else the project's reference serves, with the dispatcher's warning).

The engines' layout, from the definition's:
- query: q_nope ‖ q_pe as one 576-wide row per head, the 16 heads zero-padded to 64 (the kernel
  takes 64 or 128), one [T, 64, 576] buffer a call; the output's and lse's first 16 heads are kept.
- cache: the engines keep each token's ckv ‖ kpe as one 576-wide row ([pages * 64, 1, 576]); the
  definition has them in two tensors, so the fused rows are built once per cache (keyed by the
  tensors' storage and version counter: an in-place write to either rebuilds them, at that call)
  and kept for the most recent FUSED_CACHES caches. A call timed after its first therefore costs
  what it costs an engine, whose cache already has that layout.
- indices: [T, 1, 2048]; every entry outside [0, pages * 64) becomes -1 first (the kernel takes -1
  and values past the end as unused, nothing else), one launch.
- lse: asked in base 2 (the definition's).
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from kdispatch.registry import variant

HEADS, PADDED_HEADS, CKV, KPE = 16, 64, 512, 64
FUSED_CACHES = 4
_fused: OrderedDict = OrderedDict()  # (storage pointers, versions, shape) -> [pages * 64, 1, 576]


def fused_cache(ckv_cache: torch.Tensor, kpe_cache: torch.Tensor) -> torch.Tensor:
    """[pages * 64, 1, 576] bf16: each cache token's ckv ‖ kpe row, built once per cache version."""
    key = (ckv_cache.data_ptr(), ckv_cache._version, kpe_cache.data_ptr(), kpe_cache._version,
           tuple(ckv_cache.shape), ckv_cache.device)
    rows = _fused.get(key)
    if rows is None:
        tokens = ckv_cache.shape[0] * ckv_cache.shape[1]
        rows = torch.cat([ckv_cache.reshape(tokens, CKV), kpe_cache.reshape(tokens, KPE)], dim=1)[:, None]
        _fused[key] = rows
        while len(_fused) > FUSED_CACHES:
            _fused.popitem(last=False)
    else:
        _fused.move_to_end(key)
    return rows


@variant("dsa_sparse_attention", "flashmla_sparse", backend="library", archs=("sm90",), requires=("flash_mla",),
         strided=True, baseline=True)
def dsa_sparse_attention_flashmla(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    from flash_mla import flash_mla_sparse_fwd

    T = q_nope.shape[0]
    kv = fused_cache(ckv_cache, kpe_cache)
    q = q_nope.new_zeros(T, PADDED_HEADS, CKV + KPE)
    q[:, :HEADS, :CKV] = q_nope
    q[:, :HEADS, CKV:] = q_pe
    idx = torch.where((sparse_indices >= 0) & (sparse_indices < kv.shape[0]), sparse_indices, -1)
    out, _, lse = flash_mla_sparse_fwd(q, kv, idx[:, None], float(sm_scale), CKV, use_legacy=True,
                                       return_log2_lse=True)
    return out[:, :HEADS], lse[:, :HEADS]
