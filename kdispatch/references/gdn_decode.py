"""Gated DeltaNet decode, one token per sequence (kdispatch reference, k-last state).

Per value head h (query/key head h // 2 is shared by value heads 2j and 2j+1), with the state
S of shape [V, K] (k-last):

    g     = exp(-exp(A_log[h]) * softplus(a + dt_bias[h]))      decay in (0, 1)
    beta  = sigmoid(b)                                          write strength
    S     = g * S                                               decay
    u     = S @ k                                               what S currently recalls for k  [V]
    S     = S + outer(beta * (v - u), k)                        delta-rule correction
    o     = scale * S @ q                                       read out with the new state  [V]

All math in float32; the output is rounded to bfloat16 once at the end. The whole batch and all
heads are updated together with batched matmuls. The caller's `state` is never written.
"""
import math

import torch
import torch.nn.functional as F


@torch.no_grad()
def run(q, k, v, state, A_log, a, dt_bias, b, scale):
    """One decode step of gated delta-rule linear attention.

    Args:
        q: [B, 1, 4, 128] bfloat16, queries (normally L2-normalised per head by the model).
        k: [B, 1, 4, 128] bfloat16, keys (normally L2-normalised per head).
        v: [B, 1, 8, 128] bfloat16, values.
        state: [B, 8, 128, 128] float32 in [B, H, V, K] (k-last) layout, or None for a zero state.
        A_log: [8] float32, log of the per-head decay rate.
        a: [B, 1, 8] bfloat16, input-dependent decay logit.
        dt_bias: [8] float32, bias added to `a` before softplus.
        b: [B, 1, 8] bfloat16, write-gate logit (beta = sigmoid(b)).
        scale: float (or None / 0 for 1/sqrt(128)), output scale.

    Returns:
        output: [B, 1, 8, 128] bfloat16.
        new_state: [B, 8, 128, 128] float32, k-last, a fresh tensor.
    """
    batch, seq_len, num_q_heads, head_k = q.shape
    num_k_heads = k.shape[2]
    num_v_heads, head_v = v.shape[2], v.shape[3]
    assert seq_len == 1, "decode takes exactly one token per sequence"
    assert num_q_heads == 4 and num_k_heads == 4 and num_v_heads == 8
    assert head_k == 128 and head_v == 128
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(head_k)
    scale = float(scale)

    group = num_v_heads // num_q_heads
    q32 = q[:, 0].float().repeat_interleave(group, dim=1)  # [B, H, K]
    k32 = k[:, 0].float().repeat_interleave(group, dim=1)  # [B, H, K]
    v32 = v[:, 0].float()  # [B, H, V]

    decay = torch.exp(-torch.exp(A_log.float()) * F.softplus(a[:, 0].float() + dt_bias.float()))  # [B, H]
    beta = torch.sigmoid(b[:, 0].float())  # [B, H]

    if state is None:
        S = q32.new_zeros(batch, num_v_heads, head_v, head_k)
    else:
        S = state.float()
    S = S * decay[:, :, None, None]  # new tensor: the input state is left alone
    recalled = torch.matmul(S, k32.unsqueeze(-1)).squeeze(-1)  # [B, H, V]
    correction = beta.unsqueeze(-1) * (v32 - recalled)  # [B, H, V]
    S = S + correction.unsqueeze(-1) * k32.unsqueeze(-2)  # [B, H, V, K]
    out = scale * torch.matmul(S, q32.unsqueeze(-1)).squeeze(-1)  # [B, H, V]
    return out.unsqueeze(1).to(torch.bfloat16), S
