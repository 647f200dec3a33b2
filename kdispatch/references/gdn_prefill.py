"""Gated DeltaNet prefill over packed variable-length sequences (kdispatch reference, k-last state).

Sequence n owns tokens cu_seqlens[n] .. cu_seqlens[n+1]-1. For every token t of a sequence, per
value head h (query/key head h // 2 is shared by value heads 2j and 2j+1), with the state S of
shape [V, K] (k-last):

    g     = exp(-exp(A_log[h]) * softplus(a_t + dt_bias[h]))    decay in (0, 1)
    beta  = sigmoid(b_t)                                        write strength
    S     = g * S                                               decay
    u     = S @ k_t                                             what S currently recalls for k_t  [V]
    S     = S + outer(beta * (v_t - u), k_t)                    delta-rule correction
    o_t   = scale * S @ q_t                                     read out with the updated state  [V]

The recurrence is sequential in time, so this walks time steps 0 .. max_len-1 once and advances
every sequence and every head together at each step (sequences are padded to the longest one; a
padded step leaves that sequence's state untouched). All math in float32; outputs are rounded to
bfloat16 once at the end. A sequence of length 0 returns its initial state unchanged (zeros when
`state` is None). The caller's `state` is never written.

Malformed boundaries (cu_seqlens[0] != 0, a decreasing step, or cu_seqlens[N] != T) are a whole-batch
no-op: the output is all zeros and every state is returned unchanged, so no value of cu_seqlens makes
a kernel read or write outside its tensors.
"""
import math

import torch
import torch.nn.functional as F


@torch.no_grad()
def run(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    """Gated delta-rule linear attention over a packed batch of sequences.

    Args:
        q: [T, 4, 128] bfloat16, queries of all sequences packed along T (L2-normalised per head
            by the model).
        k: [T, 4, 128] bfloat16, keys (L2-normalised per head).
        v: [T, 8, 128] bfloat16, values.
        state: [N, 8, 128, 128] float32 initial states in [N, H, V, K] (k-last) layout, or None
            for zeros.
        A_log: [8] float32, log of the per-head decay rate.
        a: [T, 8] bfloat16, input-dependent decay logit.
        dt_bias: [8] float32, bias added to `a` before softplus.
        b: [T, 8] bfloat16, write-gate logit (beta = sigmoid(b)).
        cu_seqlens: [N + 1] int64, sequence boundaries (0 = cu_seqlens[0] <= ... <= cu_seqlens[N] = T;
            any other values: zero output, states unchanged).
        scale: float (or None / 0 for 1/sqrt(128)), output scale.

    Returns:
        output: [T, 8, 128] bfloat16.
        new_state: [N, 8, 128, 128] float32, k-last, the state after each sequence's last token.
    """
    total, num_q_heads, head_k = q.shape
    num_k_heads = k.shape[1]
    num_v_heads, head_v = v.shape[1], v.shape[2]
    num_seqs = cu_seqlens.shape[0] - 1
    assert num_q_heads == 4 and num_k_heads == 4 and num_v_heads == 8
    assert head_k == 128 and head_v == 128
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(head_k)
    scale = float(scale)
    device = q.device

    group = num_v_heads // num_q_heads
    q32 = q.float().repeat_interleave(group, dim=1)  # [T, H, K]
    k32 = k.float().repeat_interleave(group, dim=1)  # [T, H, K]
    v32 = v.float()  # [T, H, V]
    decay = torch.exp(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))  # [T, H]
    beta = torch.sigmoid(b.float())  # [T, H]

    if state is None:
        S = torch.zeros(num_seqs, num_v_heads, head_v, head_k, dtype=torch.float32, device=device)
    else:
        S = state.float().clone()  # [N, H, V, K]

    # out has one spare row (index T) that absorbs the writes of padded steps.
    out = torch.zeros(total + 1, num_v_heads, head_v, dtype=torch.float32, device=device)
    if num_seqs == 0 or total == 0:
        return out[:total].to(torch.bfloat16), S

    cu = cu_seqlens.to(device=device, dtype=torch.long)
    starts = cu[:-1]  # [N]
    lengths = cu[1:] - starts  # [N]
    if int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()):
        return out[:total].to(torch.bfloat16), S
    max_len = int(lengths.max())
    for step in range(max_len):
        active = step < lengths  # [N]
        tok = torch.where(active, starts + step, torch.full_like(starts, total))  # [N]
        src = tok.clamp(max=total - 1)
        q_t, k_t, v_t = q32[src], k32[src], v32[src]  # [N, H, D]
        g_t, beta_t = decay[src], beta[src]  # [N, H]

        S_new = S * g_t[:, :, None, None]
        recalled = torch.matmul(S_new, k_t.unsqueeze(-1)).squeeze(-1)  # [N, H, V]
        correction = beta_t.unsqueeze(-1) * (v_t - recalled)  # [N, H, V]
        S_new = S_new + correction.unsqueeze(-1) * k_t.unsqueeze(-2)  # [N, H, V, K]
        S = torch.where(active[:, None, None, None], S_new, S)
        out[tok] = scale * torch.matmul(S_new, q_t.unsqueeze(-1)).squeeze(-1)  # [N, H, V]

    return out[:total].to(torch.bfloat16), S
