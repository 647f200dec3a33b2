"""FP8 block-scale MoE for decode-size batches (up to 32 tokens): expert-major, no layout step. Triton.

Definition: moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048 (the math: the reference,
kdispatch/references/moe_fp8.py). At a few tokens the routing reaches a few of the rank's 32 experts
and the work is streaming those experts' weights (44 MB each) once; the grouped kernels
(fp8_grouped.py) spend a third of their time there on the expert-sorted layout and leave most SMs
idle with one 16-row block per expert. Here every program owns one (local expert, N tile) and takes
all of the batch's (token, choice) pairs as its M rows, masked to the pairs routed to its expert:
masked rows fetch nothing, a program whose expert no pair reached exits at once, and no layout is
needed. Four launches, no host sync (capturable):

1. `_route_kernel` (fp8_grouped.py, without its layout part): local expert id and weight per pair.
2. `_gemm1_splitk_kernel`, grid (32 experts, 2048 / BLOCK_N1, SPLIT_K): the expert's up and gate
   rows [n, n + BLOCK_N1) over 1/SPLIT_K of the hidden dimension, FP8 tensor-core dots with the
   per-block scales, atomically added into an fp32 [pairs, 4096] buffer. The split puts
   SPLIT_K times more programs on each hit expert's weights: one expert is 64 N tiles, too few to
   keep an H100's 132 SMs streaming.
3. `_gemm2_kernel`, grid (32 experts, 7168 / BLOCK_N2): y = silu(gate) * up from that buffer
   (bf16, as the grouped kernels round it), times the expert's W2 rows (FP8 widened to bf16), times
   the pair's routing weight, atomically added into the fp32 output.
4. The output rounded to bf16 (after a single memset that zeroes both fp32 buffers).

The pairs are all of the batch's T * 8, padded to a power of two (>= 16, tl.dot's minimum), which
bounds the batch: 32 tokens (256 pairs; accumulators of 256 x BLOCK_N1 x 2 fp32). The order of the
atomic sums is not fixed, so results may differ in the last bits from call to call.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdispatch.references import moe_fp8 as ref
from kdispatch.registry import variant
from kdispatch.kernels.triton.moe.fp8_grouped import FILL_BLOCK, QBLOCK, _route_kernel

MAX_TOKENS = 32  # 256 pairs: the widest M tile the programs hold (see the top)


@triton.jit
def _gemm1_splitk_kernel(
    x_ptr, x_scale_ptr, w13_ptr, w13_scale_ptr, local_ptr, h_ptr, num_tokens, num_pairs,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, PAIRS: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, QB: tl.constexpr, DOT_FP32: tl.constexpr,
):
    e = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    offs_p = tl.arange(0, PAIRS)
    mine = tl.load(local_ptr + offs_p, mask=offs_p < num_pairs, other=-1) == e
    if tl.sum(mine.to(tl.int32), axis=0) == 0:
        return
    token = (offs_p // TOP_K).to(tl.int64)
    e64 = e.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, QB)

    KB: tl.constexpr = HIDDEN // QB
    kb_start = split * KB // SPLIT_K
    kb_end = (split + 1) * KB // SPLIT_K
    a_ptrs = x_ptr + token[:, None] * HIDDEN + offs_k[None, :]
    up_ptrs = w13_ptr + e64 * (2 * INTER * HIDDEN) + offs_n[:, None] * HIDDEN + offs_k[None, :]
    gate_ptrs = up_ptrs + INTER * HIDDEN
    up_scale_ptr = w13_scale_ptr + e64 * (2 * INTER // QB) * KB + (pid_n * BLOCK_N // QB) * KB
    gate_scale_ptr = up_scale_ptr + (INTER // QB) * KB

    acc_up = tl.zeros([PAIRS, BLOCK_N], dtype=tl.float32)
    acc_gate = tl.zeros([PAIRS, BLOCK_N], dtype=tl.float32)
    for kb in range(kb_start, kb_end):
        a = tl.load(a_ptrs + kb * QB, mask=mine[:, None], other=0.0)
        a_scale = tl.load(x_scale_ptr + kb * num_tokens + token, mask=mine, other=0.0)
        w_up = tl.load(up_ptrs + kb * QB)
        w_gate = tl.load(gate_ptrs + kb * QB)
        if DOT_FP32:
            a, w_up, w_gate = a.to(tl.float32), w_up.to(tl.float32), w_gate.to(tl.float32)
        s_up = tl.load(up_scale_ptr + kb)
        s_gate = tl.load(gate_scale_ptr + kb)
        acc_up += tl.dot(a, tl.trans(w_up)) * (a_scale[:, None] * s_up)
        acc_gate += tl.dot(a, tl.trans(w_gate)) * (a_scale[:, None] * s_gate)

    h_rows = h_ptr + offs_p[:, None].to(tl.int64) * (2 * INTER) + offs_n[None, :]
    tl.atomic_add(h_rows, acc_up, mask=mine[:, None], sem="relaxed")
    tl.atomic_add(h_rows + INTER, acc_gate, mask=mine[:, None], sem="relaxed")


@triton.jit
def _gemm2_kernel(
    h_ptr, w2_ptr, w2_scale_ptr, local_ptr, pair_weight_ptr, out_ptr, num_pairs,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, PAIRS: tl.constexpr,
    BLOCK_N: tl.constexpr, QB: tl.constexpr, DOT_FP32: tl.constexpr,
):
    e = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_p = tl.arange(0, PAIRS)
    mine = tl.load(local_ptr + offs_p, mask=offs_p < num_pairs, other=-1) == e
    if tl.sum(mine.to(tl.int32), axis=0) == 0:
        return
    e64 = e.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, QB)

    KB: tl.constexpr = INTER // QB
    up_ptrs = h_ptr + offs_p[:, None].to(tl.int64) * (2 * INTER) + offs_k[None, :]
    w_ptrs = w2_ptr + e64 * (HIDDEN * INTER) + offs_n[:, None] * INTER + offs_k[None, :]
    scale_ptr = w2_scale_ptr + e64 * (HIDDEN // QB) * KB + (pid_n * BLOCK_N // QB) * KB

    acc = tl.zeros([PAIRS, BLOCK_N], dtype=tl.float32)
    for kb in range(KB):
        up = tl.load(up_ptrs + kb * QB, mask=mine[:, None], other=0.0)
        gate = tl.load(up_ptrs + INTER + kb * QB, mask=mine[:, None], other=0.0)
        y = (up * gate * tl.sigmoid(gate)).to(tl.bfloat16)  # silu(gate) * up, rounded as between the GEMMs
        w = tl.load(w_ptrs + kb * QB)
        if DOT_FP32:
            y, w = y.to(tl.float32), w.to(tl.float32)
        else:
            w = w.to(tl.bfloat16)
        acc += tl.dot(y, tl.trans(w)) * tl.load(scale_ptr + kb)

    weight = tl.load(pair_weight_ptr + offs_p, mask=mine, other=0.0)
    token = (offs_p // TOP_K).to(tl.int64)
    tl.atomic_add(out_ptr + token[:, None] * HIDDEN + offs_n[None, :], acc * weight[:, None],
                  mask=mine[:, None], sem="relaxed")


def moe_fp8_decode(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                   gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                   routed_scaling_factor, *, block_n1: int, block_n2: int, split_k: int, num_warps: int,
                   num_stages: int, dot_fp32: bool | None = None):
    """Routed FFN of this rank's experts for up to MAX_TOKENS tokens; returns [T, HIDDEN] bf16. Any
    HIDDEN and intermediate size that are multiples of 128 (the tests use small ones)."""
    num_tokens, hidden = hidden_states.shape
    num_local, two_inter, _ = gemm1_weights.shape
    inter = two_inter // 2
    device = hidden_states.device
    if num_tokens > MAX_TOKENS:
        raise ValueError(f"moe_fp8 decode kernels: at most {MAX_TOKENS} tokens, got {num_tokens}")
    if hidden % QBLOCK or inter % QBLOCK or QBLOCK % block_n1 or QBLOCK % block_n2:
        raise ValueError("hidden and intermediate sizes must be multiples of 128, BLOCK_N divide 128")
    if dot_fp32 is None:
        dot_fp32 = device.type != "cuda"
    num_pairs = num_tokens * ref.TOP_K
    # one memset for both fp32 accumulators: the output [T, HIDDEN] and gemm1's [pairs, 2 * INTER]
    acc = torch.zeros(num_tokens * hidden + num_pairs * two_inter, dtype=torch.float32, device=device)
    out = acc[:num_tokens * hidden].view(num_tokens, hidden)
    if num_tokens == 0:
        return out.to(torch.bfloat16)
    h = acc[num_tokens * hidden:]
    weights = torch.empty(num_pairs, dtype=torch.float32, device=device)
    local = torch.empty(num_pairs, dtype=torch.int32, device=device)
    _route_kernel[(num_tokens,)](
        routing_logits.contiguous(), routing_bias.contiguous(), weights, local, local, local,
        int(local_expert_offset), float(routed_scaling_factor), 0, 0,
        NUM_EXPERTS=routing_logits.shape[1], NUM_GROUPS=ref.NUM_GROUPS, TOP_GROUPS=ref.TOP_GROUPS,
        TOP_K=ref.TOP_K, NUM_LOCAL=num_local, FILL=FILL_BLOCK, LAYOUT=False)
    common = dict(HIDDEN=hidden, INTER=inter, TOP_K=ref.TOP_K, PAIRS=max(16, triton.next_power_of_2(num_pairs)),
                  QB=QBLOCK, DOT_FP32=bool(dot_fp32), num_warps=num_warps, num_stages=num_stages)
    _gemm1_splitk_kernel[(num_local, inter // block_n1, split_k)](
        hidden_states.contiguous(), hidden_states_scale.contiguous(), gemm1_weights.contiguous(),
        gemm1_weights_scale.contiguous(), local, h, num_tokens, num_pairs, BLOCK_N=block_n1, SPLIT_K=split_k,
        **common)
    _gemm2_kernel[(num_local, hidden // block_n2)](
        h, gemm2_weights.contiguous(), gemm2_weights_scale.contiguous(), local, weights, out, num_pairs,
        BLOCK_N=block_n2, **common)
    return out.to(torch.bfloat16)


def _decode_sized(features: dict, _config: dict) -> str | None:
    if features["seq_len"] > MAX_TOKENS:
        return f"more than {MAX_TOKENS} tokens (the decode kernels hold every pair in one tile)"
    return None


# Candidates the tuner measures: N tile widths and hidden-dimension splits (more programs per hit
# expert against more atomics into the fp32 buffer). Untimed when written (2026-11-25).
CONFIGS = {
    "n32s4": dict(block_n1=32, block_n2=32, split_k=4, num_warps=4, num_stages=4),
    "n16s4": dict(block_n1=16, block_n2=32, split_k=4, num_warps=4, num_stages=4),
    "n32s8": dict(block_n1=32, block_n2=32, split_k=8, num_warps=4, num_stages=4),
    "n32s2": dict(block_n1=32, block_n2=64, split_k=2, num_warps=4, num_stages=4),
    "n64s4": dict(block_n1=64, block_n2=64, split_k=4, num_warps=8, num_stages=3),
}


@variant("moe_fp8", "triton_decode", backend="triton", archs=("sm90",), requires=("triton",), configs=CONFIGS,
         supports=_decode_sized)
def moe_fp8_triton_decode(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                          gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                          routed_scaling_factor, **config):
    return moe_fp8_decode(routing_logits, routing_bias, hidden_states, hidden_states_scale, gemm1_weights,
                          gemm1_weights_scale, gemm2_weights, gemm2_weights_scale, local_expert_offset,
                          routed_scaling_factor, **config)
