"""Gated DeltaNet speculative verification (MTP draft tokens) in vLLM's convention (kdispatch
reference): every request reads its state from the slot of its last accepted step and writes the
state after each of its steps into that step's own slot of the pool, from which the next step
continues once the engine knows how many drafts were accepted.

Request n owns tokens cu_seqlens[n] .. cu_seqlens[n+1]-1 and the slots step_slots[n, 0 .. S-1].
With a = num_accepted[n] in [1, S], it starts from state_pool[step_slots[n, a - 1]]; where a is
outside [1, S] or that slot lies outside [1, num_slots) (slot 0 is vLLM's null block) the request is
padding: zero output, nothing read or written. Otherwise, after its step j (j < S) the state is
written to state_pool[step_slots[n, j]] where that slot lies in [1, num_slots); a request's steps
past S are computed but store nothing. Every request's starting state is read before any step's
state is written. For every token t, per value head h (q/k head h // (HV / HQ)), with the state S
of shape [V, K] (k-last):

    q_t, k_t = x / sqrt(sum(x * x) + 1e-6)   L2 norm in the op
    g_t   = exp(-exp(A_log) * softplus(a_t + dt_bias))   (softplus: beta 1, threshold 20)
    beta_t = sigmoid(b_t)
    S     = g_t * S
    S     = S + outer(beta_t * (v_t - S @ k_t), k_t)
    o_t   = scale * S @ q_t

All math in float32; outputs are rounded to bfloat16 once. Malformed boundaries (cu_seqlens[0] != 0,
a decreasing step, or cu_seqlens[N] != T) are read as the even partition cu[n] = n * T // N. Two
writes to one slot: which lands is not specified. The caller's tensors are never written: the new
pool is a fresh tensor.
"""
import math

import torch


@torch.no_grad()
def run(q, k, v, a, b, A_log, dt_bias, state_pool, step_slots, num_accepted, cu_seqlens, scale):
    """Gated delta-rule verification over a state pool with a slot per draft step.

    Args:
        q: [T, HQ, 128] bfloat16, queries (normalised here).   k: [T, HQ, 128] bfloat16, keys.
        v: [T, HV, 128] bfloat16, values.
        a: [T, HV] bfloat16, decay input.   b: [T, HV] bfloat16, write-strength input.
        A_log: [HV] float32.   dt_bias: [HV] float32.
        state_pool: [num_slots, HV, 128, 128] float32, k-last states; slot 0 is never used.
        step_slots: [N, S] int32, each request's slot per step.
        num_accepted: [N] int32, each request's accepted steps (its state is at step num_accepted - 1).
        cu_seqlens: [N + 1] int32, request boundaries.
        scale: float (None or 0: 1/sqrt(128)).

    Returns:
        output: [T, HV, 128] bfloat16.
        new_state_pool: [num_slots, HV, 128, 128] float32, the pool after the call.
    """
    total, hq, dk = q.shape
    num_slots, hv, dv, _ = state_pool.shape
    num_seqs, steps = step_slots.shape
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(dk)
    device = q.device
    new_pool = state_pool.clone()
    out32 = torch.zeros(total + 1, hv, dv, dtype=torch.float32, device=device)  # row T absorbs padded steps
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    if num_seqs == 0 or total == 0:
        return out32[:total].to(torch.bfloat16), new_pool
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

    slots = step_slots.to(device=device, dtype=torch.long)
    acc = num_accepted.to(device=device, dtype=torch.long)
    accepted = (acc >= 1) & (acc <= steps)
    src = slots.gather(1, (acc - 1).clamp(0, steps - 1)[:, None])[:, 0]
    live = accepted & (src >= 1) & (src < num_slots)
    S = torch.zeros(num_seqs, hv, dv, dk, dtype=torch.float32, device=device)
    S[live] = state_pool[src[live]].float()
    lengths = torch.where(live, lengths, torch.zeros_like(lengths))  # padding makes no step

    for step in range(int(lengths.max())):
        active = step < lengths  # [N]
        tok = torch.where(active, starts + step, torch.full_like(starts, total))
        srct = tok.clamp(max=total - 1)
        q_t, k_t, v_t = q32[srct], k32[srct], v32[srct]  # [N, HV, D]
        S_new = S * decay[srct][:, :, None, None]
        recalled = torch.matmul(S_new, k_t.unsqueeze(-1)).squeeze(-1)  # [N, HV, V]
        S_new = S_new + (beta32[srct].unsqueeze(-1) * (v_t - recalled)).unsqueeze(-1) * k_t.unsqueeze(-2)
        S = torch.where(active[:, None, None, None], S_new, S)
        out32[tok] = float(scale) * torch.matmul(S_new, q_t.unsqueeze(-1)).squeeze(-1)
        if step < steps:
            dst = slots[:, step]
            store = active & (dst >= 1) & (dst < num_slots)
            new_pool[dst[store]] = S[store]

    return out32[:total].to(torch.bfloat16), new_pool
