"""FlashInfer's FA3 MLA kernel (`BatchMLAPagedAttentionWrapper`, backend "fa3", FlashInfer 0.7.2) as
vLLM's Hopper sparse-MLA backend drives it for DeepSeek-V3.2: page size 1, so each query token is one
request whose pages are its valid top-k token ids (CSR), the native 16 heads, the two caches as
[pages * 64, 1, 512] and [pages * 64, 1, 64] views. A peer of dsa_sparse_attention on sm_90, not its
baseline (FlashMLA is: kernels/library/dsa/flashmla.py).

The wrapper schedules from host-side lengths. vLLM plans once a step, outside any graph, from the
lengths its scheduler holds on the host, then each layer packs its ids and runs. The definition holds
them only on the device (the -1 entries of sparse_indices, and any value outside [0, pages * 64), are
unused), so each call here counts a row's valid ids, reads the counts back (a sync, which no CUDA
graph capture allows: there it raises) and plans before it runs; its eager time holds a plan that an
engine shares between its layers. A token without a valid id is left out of the plan and gets the
definition's zero output and -inf lse.

FlashInfer compiles the module with nvcc on its first call (benchmarks/stage_flashinfer_jit.sh builds
it and installs it prebuilt): the variant runs only where it is built already (`fa3_module_ready`).
"""
from __future__ import annotations

import torch

from kdispatch.registry import variant

HEADS, CKV, KPE = 16, 512, 64
WORKSPACE_BYTES = 128 * 1024 * 1024  # the float workspace vLLM gives the wrapper
_wrappers: dict = {}  # device -> the wrapper (its workspace kept for the process)


def fa3_module_name() -> str:
    """FlashInfer's name of the FA3 MLA module this variant runs (bf16 q, cache and output, int32 ids,
    512 + 64 wide): its JIT cache folder and prebuilt file are named after it."""
    from flashinfer.jit.attention.modules import get_batch_mla_uri

    return get_batch_mla_uri("fa3", torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32, CKV, KPE, False)


def fa3_module_ready() -> str | None:
    """None when the FA3 MLA module is built (prebuilt, or in the JIT cache), else why not. Asks by
    name: FlashInfer's spec of the module would render its sources, which a machine given the module
    prebuilt may lack."""
    from flashinfer.jit import env

    name = fa3_module_name()
    if env.get_aot_artifacts(name) or (env.FLASHINFER_JIT_DIR / name / f"{name}.so").exists():
        return None
    return ("FlashInfer's FA3 MLA module is not built (its first call compiles it with nvcc for minutes): "
            "build it once, as benchmarks/stage_flashinfer_jit.sh's setup does, or install it prebuilt")


def _wrapper(device: torch.device):
    w = _wrappers.get(device)
    if w is None:
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        w = BatchMLAPagedAttentionWrapper(torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device),
                                          backend="fa3")
        _wrappers[device] = w
    return w


@variant("dsa_sparse_attention", "flashinfer_fa3", backend="library", archs=("sm90",), requires=("flashinfer",),
         ready=fa3_module_ready)
def dsa_sparse_attention_flashinfer_fa3(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    from flashinfer.mla import MLAPlanMetadata

    if q_nope.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("flashinfer_fa3: FlashInfer's MLA wrapper plans from host-side lengths, read back "
                           "with a sync that a CUDA graph capture does not allow")
    T = q_nope.shape[0]
    tokens = ckv_cache.shape[0] * ckv_cache.shape[1]
    output = torch.zeros(T, HEADS, CKV, dtype=torch.bfloat16, device=q_nope.device)
    lse = torch.full((T, HEADS), float("-inf"), dtype=torch.float32, device=q_nope.device)
    valid = (sparse_indices >= 0) & (sparse_indices < tokens)
    lens = valid.sum(dim=1, dtype=torch.int32).cpu()  # the sync
    rows = torch.nonzero(lens).flatten()
    if not rows.numel():
        return output, lse
    every = rows.numel() == T
    if not every:  # only the tokens with a valid id are planned
        on_device = rows.to(q_nope.device)
        q_nope, q_pe, sparse_indices, valid = (t[on_device] for t in (q_nope, q_pe, sparse_indices, valid))
        lens = lens[rows]
    kv_indptr = torch.zeros(lens.numel() + 1, dtype=torch.int32)
    torch.cumsum(lens, dim=0, out=kv_indptr[1:])
    w = _wrapper(q_nope.device)
    w.plan(metadata=MLAPlanMetadata.csr(torch.arange(lens.numel() + 1, dtype=torch.int32), kv_indptr,
                                        sparse_indices[valid], lens),  # row by row: each row's ids in order
           num_heads=HEADS, head_dim_ckv=CKV, head_dim_kpe=KPE, page_size=1, causal=False,
           sm_scale=float(sm_scale), q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, lse_mode="base2",
           query_layout="split", kv_cache_layout="split")  # the definition's separate tensors, not one packed row
    kv_cache = (ckv_cache.view(tokens, 1, CKV), kpe_cache.view(tokens, 1, KPE))
    out, out_lse = w.run(query=(q_nope, q_pe), kv_cache=kv_cache, return_lse=True)
    if every:
        return out, out_lse
    output[on_device] = out
    lse[on_device] = out_lse
    return output, lse
