"""DeepSeek-V3 FP8 block-scaled mixture-of-experts on one expert-parallel rank (kdispatch reference).

Routing (no auxiliary loss, over all 256 experts):

    s        = sigmoid(routing_logits)                       [T, 256]
    sel      = s + routing_bias                              selection score only
    group    = sum of the 2 largest `sel` in each of 8 groups of 32 experts
    experts  = the 8 largest `sel` inside the 4 best groups
    w[e]     = routed_scaling_factor * s[e] / sum(s over the 8 chosen experts)   (bias not used)

Expert e of this rank (global id local_expert_offset + e) then computes, for its tokens x:

    h = x @ W13[e]^T                  [Tk, 4096]
    y = silu(h[:, 2048:]) * h[:, :2048]      second half gated by silu, times the first half
    out += w[e] * (y @ W2[e]^T)       [Tk, 7168]

FP8 tensors are dequantised as value * scale with one scale per 128 x 128 block of a weight matrix
and one per 128 hidden columns of each token (hidden_states_scale is stored transposed, [56, T]).
All math in float32, rounded to bfloat16 once at the end. Experts of other ranks contribute
nothing. Only experts that received tokens are dequantised, one at a time, so the working set is
one expert's float32 weights (~176 MB) plus activations.
"""
import torch
import torch.nn.functional as F

HIDDEN = 7168
INTERMEDIATE = 2048
NUM_EXPERTS = 256
NUM_LOCAL_EXPERTS = 32
BLOCK = 128
TOP_K = 8
NUM_GROUPS = 8
TOP_GROUPS = 4


def _dequant_blocks(w_fp8, scale):
    """[R, C] FP8 with [R/128, C/128] scales -> [R, C] float32."""
    rows, cols = w_fp8.shape
    w = w_fp8.to(torch.float32).view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
    return (w * scale.to(torch.float32)[:, None, :, None]).view(rows, cols)


def _route(routing_logits, routing_bias, routed_scaling_factor):
    """Chosen global expert ids [T, 8] and their combine weights [T, 8] float32."""
    num_tokens = routing_logits.shape[0]
    s = torch.sigmoid(routing_logits.to(torch.float32))  # [T, 256]
    sel = s + routing_bias.to(torch.float32).reshape(1, -1)
    grouped = sel.view(num_tokens, NUM_GROUPS, NUM_EXPERTS // NUM_GROUPS)
    group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, 8]
    best_groups = group_score.topk(TOP_GROUPS, dim=-1).indices  # [T, 4]
    keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best_groups, True)
    sel = sel.masked_fill(~keep.repeat_interleave(NUM_EXPERTS // NUM_GROUPS, dim=1), float("-inf"))
    experts = sel.topk(TOP_K, dim=-1).indices  # [T, 8]
    chosen = torch.gather(s, 1, experts)
    weights = chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20) * float(routed_scaling_factor)
    return experts, weights


@torch.no_grad()
def run(
    routing_logits,
    routing_bias,
    hidden_states,
    hidden_states_scale,
    gemm1_weights,
    gemm1_weights_scale,
    gemm2_weights,
    gemm2_weights_scale,
    local_expert_offset,
    routed_scaling_factor,
):
    """Routed expert FFN of this rank's 32 experts for a batch of tokens.

    Args:
        routing_logits: [T, 256] float32, router logits over all experts.
        routing_bias: [256] bfloat16, selection bias (affects which experts, not their weights).
        hidden_states: [T, 7168] float8_e4m3fn, token activations.
        hidden_states_scale: [56, T] float32, one scale per 128 hidden columns per token
            (block-major).
        gemm1_weights: [32, 4096, 7168] float8_e4m3fn, per local expert the stacked [first half;
            second half] of the gate/up projection.
        gemm1_weights_scale: [32, 32, 56] float32, per 128 x 128 block of gemm1_weights.
        gemm2_weights: [32, 7168, 2048] float8_e4m3fn, down projections.
        gemm2_weights_scale: [32, 56, 16] float32, per 128 x 128 block of gemm2_weights.
        local_expert_offset: int, global id of this rank's first expert.
        routed_scaling_factor: float, multiplies the normalised routing weights.

    Returns:
        output: [T, 7168] bfloat16, sum over this rank's chosen experts of weight * expert(x).
    """
    num_tokens, hidden = hidden_states.shape
    num_local = gemm1_weights.shape[0]
    assert hidden == HIDDEN and routing_logits.shape == (num_tokens, NUM_EXPERTS)
    assert num_local == NUM_LOCAL_EXPERTS
    assert gemm1_weights.shape == (num_local, 2 * INTERMEDIATE, HIDDEN)
    assert gemm2_weights.shape == (num_local, HIDDEN, INTERMEDIATE)
    assert hidden_states_scale.shape == (HIDDEN // BLOCK, num_tokens)
    device = hidden_states.device
    offset = int(local_expert_offset)

    experts, weights = _route(routing_logits, routing_bias, routed_scaling_factor)  # [T, 8] each
    local = experts - offset  # local expert id, valid in [0, 32)
    is_local = (local >= 0) & (local < num_local)

    output = torch.zeros(num_tokens, HIDDEN, dtype=torch.float32, device=device)
    if num_tokens == 0:
        return output.to(torch.bfloat16)
    counts = torch.bincount(local[is_local], minlength=num_local).tolist()
    if sum(counts) == 0:
        return output.to(torch.bfloat16)

    x = hidden_states.to(torch.float32).view(num_tokens, HIDDEN // BLOCK, BLOCK)
    x = (x * hidden_states_scale.to(torch.float32).t()[:, :, None]).view(num_tokens, HIDDEN)  # [T, 7168]
    for e in range(num_local):
        if counts[e] == 0:
            continue
        hit = local == e  # [T, 8]; a token picks an expert at most once
        tokens = hit.any(dim=1).nonzero().squeeze(1)  # [Tk]
        w_tok = (weights * hit).sum(dim=1)[tokens]  # [Tk]
        w13 = _dequant_blocks(gemm1_weights[e], gemm1_weights_scale[e])  # [4096, 7168]
        h = x[tokens] @ w13.t()  # [Tk, 4096]
        del w13
        y = F.silu(h[:, INTERMEDIATE:]) * h[:, :INTERMEDIATE]  # [Tk, 2048]
        w2 = _dequant_blocks(gemm2_weights[e], gemm2_weights_scale[e])  # [7168, 2048]
        output.index_add_(0, tokens, (y @ w2.t()) * w_tok[:, None])
        del w2
    return output.to(torch.bfloat16)
