"""Drop-in operators: `kdispatch.ops.<op>(...)` where SGLang or vLLM call FlashInfer today.

Arguments and outputs follow the definitions (kdispatch/definitions/); each call goes through the
definition's generated router for the device's architecture (kdispatch/dispatch.py).

GDN state contract: when `state` is given it is updated in place and returned as `new_state`
(serving engines keep one state per sequence in a pool, as FlashInfer's decode does); when it
is None, a zero state is allocated and returned.
"""
from __future__ import annotations

import math

import torch

from kdispatch.dispatch import Dispatcher

_moe_fp8 = Dispatcher("moe_fp8")
_dsa_topk_indexer = Dispatcher("dsa_topk_indexer")
_dsa_sparse_attention = Dispatcher("dsa_sparse_attention")
_gdn_decode = Dispatcher("gdn_decode")
_gdn_prefill = Dispatcher("gdn_prefill")

DISPATCHERS = {d.short: d for d in (_moe_fp8, _dsa_topk_indexer, _dsa_sparse_attention, _gdn_decode, _gdn_prefill)}

_GDN_HEADS, _GDN_DIM = 8, 128
_GDN_DEFAULT_SCALE = 1.0 / math.sqrt(_GDN_DIM)


def moe_fp8(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
            gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
            routed_scaling_factor):
    """DeepSeek-V3 FP8 block-scale MoE on one EP rank -> output bf16 [seq_len, 7168]."""
    return _moe_fp8(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                    gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                    routed_scaling_factor)


def dsa_topk_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table):
    """DeepSeek-V3.2 indexer -> topk_indices int32 [batch_size, 2048] (global token ids, -1 padded)."""
    return _dsa_topk_indexer(q_index_fp8, k_index_cache_fp8, weights, seq_lens, block_table)


def dsa_sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale):
    """DeepSeek-V3.2 sparse MLA attention -> (output bf16 [T, 16, 512], lse fp32 base-2 [T, 16])."""
    return _dsa_sparse_attention(q_nope, q_pe, ckv_cache, kpe_cache, sparse_indices, sm_scale)


def gdn_decode(q, k, v, state, A_log, a, dt_bias, b, scale=None):
    """Gated DeltaNet decode -> (output bf16 [B, 1, 8, 128], new_state fp32 [B, 8, 128, 128])."""
    if state is None:
        state = torch.zeros(q.shape[0], _GDN_HEADS, _GDN_DIM, _GDN_DIM, dtype=torch.float32, device=q.device)
    return _gdn_decode(q, k, v, state, A_log, a, dt_bias, b, scale or _GDN_DEFAULT_SCALE)


def gdn_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale=None):
    """Gated DeltaNet prefill over packed sequences -> (output bf16 [T, 8, 128], new_state fp32 [N, 8, 128, 128])."""
    if state is None:
        state = torch.zeros(cu_seqlens.shape[0] - 1, _GDN_HEADS, _GDN_DIM, _GDN_DIM, dtype=torch.float32,
                            device=q.device)
    return _gdn_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale or _GDN_DEFAULT_SCALE)
