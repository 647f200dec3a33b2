"""DSA sparse MLA attention, split-K: CUDA partial kernel (NVRTC) + the Triton split-K merge.

    q_nope [T, 16, 512] bf16    q_pe [T, 16, 64] bf16    ckv_cache [P, 64, 512] bf16
    kpe_cache [P, 64, 64] bf16  sparse_indices [T, 2048] int32 (page * 64 + slot, -1 = unused)
    sm_scale float  ->  output [T, 16, 512] bf16, lse [T, 16] fp32 (base 2; no valid key: 0, -inf)

NS CTAs per token (grid NS x T) gather their 2048 / NS selected rows straight from the paged caches
with TMA bulk copies, run QK and PV on the tensor cores (mma.sync) with a base-2 online softmax,
and write normalized partials and their lse; the Triton variant's `merge_splits` combines them.
Two launches, no host sync (CUDA-graph safe; the 64-split config launches the merge as a programmatic
dependent, see the .cu). From 129 tokens on NS = 1: one CTA per token writes
the output itself (one launch, no workspace). See sparse_attention_splitk.cu.
"""
from __future__ import annotations

from pathlib import Path

import torch

from kdispatch import nvrtc
from kdispatch.kernels.triton.dsa import sparse_attention_splitk as triton_splitk
from kdispatch.registry import variant

CU = Path(__file__).with_name("sparse_attention_splitk.cu")
SIGNATURE = "pppppppfi"  # qn qp ckv kpe idx ws_o ws_lse, scale_log2 n_cache_tokens
HEADS, DC, DP, TOPK, PAGE_SIZE = 16, 512, 64, 2048, 64
LOG2E = 1.4426950408889634
GROUP_THREADS, BN = 128, 32  # a group of 4 warps; keys per pipeline block
STAGE_BYTES = BN * ((DC + DP) * 2 + 16)  # a block of gathered keys in shared memory (as in the .cu)
SRED_BYTES = 4 * HEADS * (BN + 8) * 4  # per group
# (splits per token, ring stages per group, groups) compiled in the .cu
CONFIGS = ((64, 1, 1), (16, 2, 2), (8, 2, 2), (4, 2, 2), (2, 2, 2), (1, 2, 2))
EARLY_MERGE_SPLITS = 64  # the config whose kernel lets the merge launch early (as in the .cu)
MAX_CTAS = 256  # splits x tokens above 4 tokens: bounds the fp32 workspace at 8 MiB

_kernels: dict[tuple[int, int, int], nvrtc.Kernel] = {}


def config(num_tokens: int) -> tuple[int, int, int]:
    """(splits per token, ring stages per group, groups) for `num_tokens` query tokens. From
    `benchmarks/dsa.py --sweep cuda` (H100, 2026-11-23, CUDA graphs, rotated inputs): 64 splits of
    one 32-key block at 1-2 tokens (T=1: 9.1 us; 32 splits of 64 keys 9.5, 16 of 128 keys 12.9),
    16 splits of 128 keys from 6 tokens on (T=8: 17.5 us; 32 splits 20.4, 64 splits 22.6: more
    splits write and merge more fp32 partials, 32 KB each, and share an SM's gather rate). Past 16
    tokens the splits halve to keep splits x tokens <= 256 (the workspace within 8 MiB), and from
    129 tokens on one CTA per token writes the output directly."""
    if num_tokens <= 4:
        return 64, 1, 1
    splits = 16  # many tokens: fewer splits, down to one CTA per token (no workspace, no merge)
    while splits > 1 and splits * num_tokens > MAX_CTAS:
        splits //= 2
    return splits, 2, 2


def shared_bytes(splits: int, stages: int, groups: int) -> int:
    blocks = TOPK // splits // BN
    return groups * (stages * STAGE_BYTES + SRED_BYTES + stages * 8) + (blocks + blocks % 2) * 4


def kernel(splits: int, stages: int, groups: int) -> nvrtc.Kernel:
    key = (splits, stages, groups)
    kern = _kernels.get(key)
    if kern is None:
        if key not in CONFIGS:
            raise ValueError(f"dsa sparse attention (cuda split-K): no kernel for splits={splits}, "
                             f"stages={stages}, groups={groups}")
        kern = nvrtc.load_kernel(CU, "dsa_sparse_attn_partial_ns{}_s{}_g{}".format(*key), signature=SIGNATURE)
        kern.set_attribute("MAX_DYNAMIC_SHARED_SIZE_BYTES", shared_bytes(*key))
        _kernels[key] = kern
    return kern


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """Contiguous with 16-byte aligned storage (the kernel reads 16-byte rows and 4-byte pairs)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


MAX_WORKSPACE_CTAS = 1024  # splits x tokens of a registered configuration: at most 32 MiB of fp32 partials


def _fits_workspace(features: dict, kwargs: dict) -> str | None:
    splits = kwargs["cfg"][0]
    if splits > 1 and splits * features["num_tokens"] > MAX_WORKSPACE_CTAS:
        return f"{splits} splits x {features['num_tokens']} tokens: workspace above 32 MiB"
    return None


# Every compiled configuration is a candidate the tuner measures (`cuda_splitk.s64`, ...); `config(T)`
# is the default of a direct call.
@variant("dsa_sparse_attention", "cuda_splitk", backend="cuda", archs=("sm90",), requires=("triton", "cuda.core"),
         configs={f"s{c[0]}": dict(cfg=c) for c in CONFIGS}, supports=_fits_workspace)
def dsa_sparse_attention_cuda_splitk(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale, *,
                                     cfg: tuple[int, int, int] | None = None):
    T = q_nope.shape[0]
    if (tuple(q_nope.shape[1:]) != (HEADS, DC) or tuple(q_pe.shape) != (T, HEADS, DP)
            or tuple(ckv_cache.shape[1:]) != (PAGE_SIZE, DC) or tuple(kpe_cache.shape[1:]) != (PAGE_SIZE, DP)
            or tuple(sparse_indices.shape) != (T, TOPK)):
        raise ValueError("dsa sparse attention (cuda split-K): expected q_nope [T, 16, 512], q_pe [T, 16, 64], "
                         "caches [P, 64, 512] / [P, 64, 64], sparse_indices [T, 2048]")
    if sparse_indices.dtype != torch.int32 or any(
            x.dtype != torch.bfloat16 for x in (q_nope, q_pe, ckv_cache, kpe_cache)):
        raise ValueError("dsa sparse attention (cuda split-K): bf16 q and caches, int32 indices")
    output, lse, sm_scale = triton_splitk.new_outputs(q_nope, sm_scale)
    if T == 0:
        return output, lse
    splits, stages, groups = cfg = cfg or config(T)
    qn, qp, idx = _aligned(q_nope), _aligned(q_pe), _aligned(sparse_indices)
    ckv, kpe = _aligned(ckv_cache), _aligned(kpe_cache)  # a cache pool is already both
    if splits == 1:  # one CTA per token writes the output itself
        ws_o, ws_lse = output, lse
    else:
        ws_o, ws_lse = triton_splitk.split_workspace(output, splits)
    kernel(*cfg).launch(
        (splits, T), groups * GROUP_THREADS, qn, qp, ckv, kpe, idx, ws_o, ws_lse,
        sm_scale * LOG2E, ckv.shape[0] * PAGE_SIZE,
        shmem=shared_bytes(*cfg), stream=nvrtc.current_stream(q_nope.device.index))
    if splits > 1:  # the 64-split kernel releases the merge early (see the .cu); others at their end
        triton_splitk.merge_splits(ws_o, ws_lse, output, lse, pdl=splits == EARLY_MERGE_SPLITS)
    return output, lse
