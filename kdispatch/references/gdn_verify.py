"""Gated DeltaNet speculative verification (MTP / EAGLE draft tokens) in SGLang's convention (kdispatch
reference): every request runs its draft tokens from its slot's state without committing it, and
the state after each step is kept in an intermediate-states buffer, from which the engine commits
the accepted step afterwards.

Sequence n owns tokens cu_seqlens[n] .. cu_seqlens[n+1]-1. It starts from state_pool[s],
s = state_indices[n], or from zeros where s lies outside [0, num_slots) (a padding request); the
pool is never written. With c = cache_indices[n] inside [0, num_cache_rows) and at most cache_steps
tokens, the state after its step j is stored in intermediate_states[c, j]; other entries stay as they
were. For every token t, per value head h (q/k head h // (HV / HQ)), with the state S of shape [V, K] (k-last):

    q_t, k_t = x / sqrt(sum(x * x) + 1e-6)   L2 norm in the op
    g_t   = exp(-exp(A_log) * softplus(a_t + dt_bias))   (softplus: beta 1, threshold 20)
    beta_t = sigmoid(b_t)
    S     = g_t * S
    S     = S + outer(beta_t * (v_t - S @ k_t), k_t)
    o_t   = scale * S @ q_t

All math in float32; outputs are rounded to bfloat16 once. Malformed boundaries (cu_seqlens[0] != 0,
a decreasing step, or cu_seqlens[N] != T) are read as the even partition cu[n] = n * T // N.
Two requests naming one cache row both store into it; which lands is not specified. The caller's
tensors are never written: the new buffer is a fresh tensor.
"""
import math

import torch


@torch.no_grad()
def run(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, cu_seqlens, intermediate_states,
        cache_indices, scale):
    """Gated delta-rule verification over a state pool, caching every step's state.

    Args:
        q: [T, HQ, 128] bfloat16, queries (normalised here).   k: [T, HQ, 128] bfloat16, keys.
        v: [T, HV, 128] bfloat16, values.
        a: [T, HV] bfloat16, decay input.   b: [T, HV] bfloat16, write-strength input.
        A_log: [HV] float32.   dt_bias: [HV] float32.
        state_pool: [num_slots, HV, 128, 128] float32, k-last states (read only).
        state_indices: [N] int32, each request's slot; outside [0, num_slots): start from zeros.
        cu_seqlens: [N + 1] int32, request boundaries.
        intermediate_states: [num_cache_rows, cache_steps, HV, 128, 128] float32.
        cache_indices: [N] int32, each request's row of intermediate_states; outside: not stored.
        scale: float (None or 0: 1/sqrt(128)).

    Returns:
        output: [T, HV, 128] bfloat16.
        new_intermediate_states: [num_cache_rows, cache_steps, HV, 128, 128] float32.
    """
    total, hq, dk = q.shape
    num_slots, hv, dv, _ = state_pool.shape
    num_rows, steps = intermediate_states.shape[:2]
    num_seqs = cu_seqlens.shape[0] - 1
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(dk)
    device = q.device
    new_inter = intermediate_states.clone()
    out32 = torch.zeros(total + 1, hv, dv, dtype=torch.float32, device=device)  # row T absorbs padded steps
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    if num_seqs == 0 or total == 0:
        return out32[:total].to(torch.bfloat16), new_inter
    if int(cu[0]) != 0 or int(cu[-1]) != total or bool((cu[1:] < cu[:-1]).any()):
        cu = torch.arange(num_seqs + 1, device=device) * total // num_seqs
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]

    group = hv // hq
    qf, kf = q.float(), k.float()
    qf = qf / torch.sqrt((qf * qf).sum(-1, keepdim=True) + 1e-6)
    kf = kf / torch.sqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
    q32, k32 = qf.repeat_interleave(group, dim=1), kf.repeat_interleave(group, dim=1)  # [T, HV, K]
    v32 = v.float()
    x = a.float() + dt_bias.float()
    softplus = torch.where(x <= 20.0, torch.log1p(torch.exp(x)), x)
    decay = torch.exp(-torch.exp(A_log.float()) * softplus)  # [T, HV]
    beta32 = torch.sigmoid(b.float())

    slots = state_indices.to(device=device, dtype=torch.long)
    live = (slots >= 0) & (slots < num_slots)
    S = torch.zeros(num_seqs, hv, dv, dk, dtype=torch.float32, device=device)
    S[live] = state_pool[slots[live]].float()
    rows = cache_indices.to(device=device, dtype=torch.long)
    cached = (rows >= 0) & (rows < num_rows) & (lengths <= steps)

    for step in range(int(lengths.max())):
        active = step < lengths  # [N]
        tok = torch.where(active, starts + step, torch.full_like(starts, total))
        src = tok.clamp(max=total - 1)
        q_t, k_t, v_t = q32[src], k32[src], v32[src]  # [N, HV, D]
        S_new = S * decay[src][:, :, None, None]
        recalled = torch.matmul(S_new, k_t.unsqueeze(-1)).squeeze(-1)  # [N, HV, V]
        S_new = S_new + (beta32[src].unsqueeze(-1) * (v_t - recalled)).unsqueeze(-1) * k_t.unsqueeze(-2)
        S = torch.where(active[:, None, None, None], S_new, S)
        out32[tok] = float(scale) * torch.matmul(S_new, q_t.unsqueeze(-1)).squeeze(-1)
        if step < steps:  # a longer request stores nothing (cached is false for it)
            store = active & cached
            new_inter[rows[store], step] = S[store]

    return out32[:total].to(torch.bfloat16), new_inter
