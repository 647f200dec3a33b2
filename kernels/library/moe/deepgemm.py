"""DeepGEMM's grouped FP8 GEMMs (`m_grouped_fp8_gemm_nt_contiguous`, DeepGEMM 2.6.1 built on the GPU
machine by benchmarks/stage_deepgemm.sh) behind the moe_fp8 definition: the contiguous-layout
pipeline SGLang's DeepGEMM MoE runner uses on Hopper for prefill-size batches, a peer of the
moe_fp8 variants on sm_90.

    step                 SGLang (deep_gemm runner, contiguous)      here
    routing + layout     its router; ep_scatter: rows grouped by    kdispatch's fused Triton routing
                         expert, each expert's run padded to 128    and layout (fp8_grouped.py,
                         rows, m_indices = expert or -1             BLOCK_M = 128), m_indices from it
    activations          per-token-group FP8 quant of bf16 x        the definition's FP8 rows and
                                                                    scales, gathered into the rows
    GEMM1                m_grouped_fp8_gemm_nt_contiguous           the same
    SiLU-and-mul, quant  silu_and_mul, per-token-group FP8 quant    torch ops, SiLU on the second
                         (128 columns)                              half (the definition's order)
    GEMM2                m_grouped_fp8_gemm_nt_contiguous           the same
    combine              post_reorder (weights, scaling factor)     index_add_ of weight x row

DeepGEMM's contiguous layout needs each expert's rows to start at a multiple of 128 (its BLOCK_M
on sm_90) and marks padding rows -1 (their blocks are skipped); it converts the activation scales
into its TMA-aligned layout itself. SGLang sizes the rows from per-expert counts its host holds
(DeepEP hands them over); here the routed block count is read back, a sync, so the variant runs
eagerly only (a capture raises), as SGLang's prefill does. Sized instead for the worst case (T x 8
rows plus each expert's padding, capturable), it took 3-28x the routed variants' time on the H100
(2026-11-27): DeepGEMM's time grew with the bound, not with the routed rows. At small batches most
rows are still padding, which is why SGLang uses the masked layout there.

`deepgemm_masked` is that decode-size layout (`m_grouped_fp8_gemm_nt_masked`, SGLang's DeepGEMM
runner below ~128 tokens in its low-latency mode): each local expert's rows in a buffer of its own,
[experts, max_m, K], with the per-expert row counts (masked_m) on the device, so the GEMMs compute
only the rows routed there. max_m is the token count rounded up to 128 (an expert takes a token at
most once). The rows are placed by the same routing kernels with a one-row block (every expert's run
unpadded), each expert's start found by a search in the sorted row-to-expert list: no host sync.
"""
from __future__ import annotations

import torch

from kdispatch.kernels.triton.moe.fp8_grouped import _fused_route_layout
from kdispatch.references import moe_fp8 as ref
from kdispatch.registry import variant

BLOCK_M = 128  # DeepGEMM's M alignment of the contiguous layout on sm_90
QBLOCK = 128
FP8_MAX = 448.0


def quantize_rows(y: torch.Tensor):
    """Per row and 128 columns FP8 e4m3 (amax / 448 scales, as SGLang's group quant): (fp8, fp32 scales)."""
    rows, cols = y.shape
    groups = y.float().view(rows, cols // QBLOCK, QBLOCK)
    scale = groups.abs().amax(dim=-1).clamp_min(1e-10) / FP8_MAX
    q = (groups / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(rows, cols)
    return q, scale


def moe_fp8_deepgemm(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                     gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                     routed_scaling_factor):
    import deep_gemm

    if hidden_states.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("deepgemm_contiguous sizes its rows from the routed counts, read back with a sync "
                           "that a CUDA graph capture does not allow")
    num_tokens, hidden = hidden_states.shape
    num_local, two_inter, _ = gemm1_weights.shape
    out = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=hidden_states.device)
    if num_tokens == 0:
        return out.to(torch.bfloat16)
    pair_weights, row_pair, block_expert = _fused_route_layout(
        routing_logits, routing_bias, local_expert_offset, routed_scaling_factor, num_local, BLOCK_M)
    blocks = int((block_expert < num_local).sum())  # the sync: the experts' runs come first, in order
    if blocks == 0:
        return out.to(torch.bfloat16)
    row_pair, block_expert = row_pair[:blocks * BLOCK_M], block_expert[:blocks]
    live = row_pair >= 0
    m_indices = torch.where(live, block_expert.repeat_interleave(BLOCK_M), -1).to(torch.int32)
    pair = row_pair.clamp(min=0).long()
    token = pair // ref.TOP_K  # padding rows read token 0 and add zero to it
    a = hidden_states.view(torch.uint8)[token].view(torch.float8_e4m3fn)
    a_scale = hidden_states_scale.t()[token].contiguous()  # [rows, hidden / 128]
    h = torch.empty(row_pair.numel(), two_inter, dtype=torch.bfloat16, device=out.device)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, a_scale), (gemm1_weights, gemm1_weights_scale), h, m_indices)
    inter = two_inter // 2
    y = torch.nn.functional.silu(h[:, inter:].float()) * h[:, :inter].float()
    yq, y_scale = quantize_rows(y)
    d = torch.empty(row_pair.numel(), hidden, dtype=torch.bfloat16, device=out.device)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((yq, y_scale), (gemm2_weights, gemm2_weights_scale), d, m_indices)
    # padding rows may hold anything (DeepGEMM skips their blocks): selected away, not multiplied by 0
    out.index_add_(0, token, torch.where(live[:, None], d.float() * pair_weights[pair][:, None], 0.0))
    return out.to(torch.bfloat16)


MASKED_MAX_TOKENS = 512  # the masked buffers hold experts x tokens rows: a decode-size layout


def _rows_into(buffer_rows: int, dest: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """A [buffer_rows + 1, ...] buffer with `rows` at `dest`; the last row takes the padding's writes."""
    out = torch.empty(buffer_rows + 1, *rows.shape[1:], dtype=rows.dtype, device=rows.device)
    out[dest] = rows
    return out


def moe_fp8_deepgemm_masked(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                            gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                            routed_scaling_factor):
    import deep_gemm

    num_tokens, hidden = hidden_states.shape
    num_local, two_inter, _ = gemm1_weights.shape
    inter = two_inter // 2
    device = hidden_states.device
    out = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=device)
    if num_tokens == 0:
        return out.to(torch.bfloat16)
    # block_m = 1: row r holds the r-th routed pair in expert order, row_expert[r] its local expert
    # (num_local past the last one), row_pair[r] -1 there
    pair_weights, row_pair, row_expert = _fused_route_layout(
        routing_logits, routing_bias, local_expert_offset, routed_scaling_factor, num_local, 1)
    experts = torch.arange(num_local, dtype=torch.int32, device=device)
    start = torch.searchsorted(row_expert, experts)
    masked_m = (torch.searchsorted(row_expert, experts, right=True) - start).to(torch.int32)
    max_m = (num_tokens + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    slots = num_local * max_m
    live = row_pair >= 0
    expert = row_expert.clamp(max=num_local - 1).long()
    position = torch.arange(row_pair.numel(), device=device) - start[expert]
    dest = torch.where(live, expert * max_m + position, slots)  # padding rows write the spare row
    pair = row_pair.clamp(min=0).long()
    token = pair // ref.TOP_K
    a = _rows_into(slots, dest, hidden_states.view(torch.uint8)[token]).view(torch.float8_e4m3fn)
    a_scale = _rows_into(slots, dest, hidden_states_scale.t()[token])
    expected_m = max(1, -(-num_tokens * ref.TOP_K // routing_logits.shape[1]))  # mean rows an expert gets
    h = torch.empty(slots + 1, two_inter, dtype=torch.bfloat16, device=device)
    deep_gemm.m_grouped_fp8_gemm_nt_masked((a[:slots].view(num_local, max_m, hidden),
                                            a_scale[:slots].view(num_local, max_m, -1)),
                                           (gemm1_weights, gemm1_weights_scale),
                                           h[:slots].view(num_local, max_m, two_inter), masked_m, expected_m)
    routed = h[dest]  # each row's GEMM1 output (padding rows: the spare row's garbage, selected away below)
    yq, y_scale = quantize_rows(torch.nn.functional.silu(routed[:, inter:].float()) * routed[:, :inter].float())
    y = _rows_into(slots, dest, yq.view(torch.uint8)).view(torch.float8_e4m3fn)
    y_scale = _rows_into(slots, dest, y_scale)
    d = torch.empty(slots + 1, hidden, dtype=torch.bfloat16, device=device)
    deep_gemm.m_grouped_fp8_gemm_nt_masked((y[:slots].view(num_local, max_m, inter),
                                            y_scale[:slots].view(num_local, max_m, -1)),
                                           (gemm2_weights, gemm2_weights_scale),
                                           d[:slots].view(num_local, max_m, hidden), masked_m, expected_m)
    out.index_add_(0, token, torch.where(live[:, None], d[dest].float() * pair_weights[pair][:, None], 0.0))
    return out.to(torch.bfloat16)


def _masked_sized(features: dict) -> str | None:
    if features["seq_len"] > MASKED_MAX_TOKENS:
        return f"more than {MASKED_MAX_TOKENS} tokens (its buffers hold experts x tokens rows)"
    return None


variant("moe_fp8", "deepgemm_contiguous", backend="library", archs=("sm90",),
        requires=("deep_gemm",))(moe_fp8_deepgemm)
variant("moe_fp8", "deepgemm_masked", backend="library", archs=("sm90",), requires=("deep_gemm",),
        supports=_masked_sized)(moe_fp8_deepgemm_masked)
