"""Gated DeltaNet prefill in the serving engines' convention (kdispatch reference): sequences packed
along the token axis, gates already activated by the caller, the recurrent states in a pool of slots.

Sequence n owns tokens cu_seqlens[n] .. cu_seqlens[n+1]-1 and slot s = state_indices[n]; a slot
outside [0, num_slots) makes it a padding sequence (its output is zero, no state is read or
written). It starts from state_pool[s] when has_initial_state[n], else from zeros, and its final
state is written to state_pool[s]. For every token t, per value head h (q/k head h // (HV / HQ)),
with the state S of shape [V, K] (k-last):

    q_t, k_t = x / sqrt(sum(x * x) + 1e-6)   L2 norm in the op (idempotent on normalised input)
    S     = exp(g_t) * S                      g: the log decay the engine computed, fp32
    S     = S + outer(beta_t * (v_t - S @ k_t), k_t)
    o_t   = scale * S @ q_t

The recurrence walks time steps 0 .. max_len-1 once, advancing every sequence and head together.
All math in float32; outputs are rounded to bfloat16 once. Malformed boundaries (cu_seqlens[0] != 0,
a decreasing step, or cu_seqlens[N] != T) are a whole-batch no-op: zero output, the pool unchanged.
Two live sequences naming one slot both start from its old state; which final state lands is not
specified. The caller's tensors are never written: the new pool is a fresh tensor.
"""
import math

import torch


@torch.no_grad()
def run(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out, scale):
    """Gated delta-rule prefill over a state pool.

    Args:
        q: [T, HQ, 128] bfloat16, queries (normalised here).   k: [T, HQ, 128] bfloat16, keys.
        v: [T, HV, 128] bfloat16, values.
        g: [T, HV] float32, log decay per token and value head (decay = exp(g), g <= 0).
        beta: [T, HV] float32, write strength per token and value head.
        state_pool: [num_slots, HV, 128, 128] float32, k-last states.
        state_indices: [N] int32, each sequence's slot; outside [0, num_slots): padding.
        has_initial_state: [N] bool, whether the sequence continues its slot's state.
        cu_seqlens: [N + 1] int32, sequence boundaries.
        out: [T, HV, 128] bfloat16, where the ops write the output (not read here).
        scale: float (None or 0: 1/sqrt(128)).

    Returns:
        output: [T, HV, 128] bfloat16.
        new_state_pool: [num_slots, HV, 128, 128] float32, the pool after the batch.
    """
    total, hq, dk = q.shape
    num_slots, hv, dv, _ = state_pool.shape
    num_seqs = cu_seqlens.shape[0] - 1
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(dk)
    device = q.device
    new_pool = state_pool.clone()
    out32 = torch.zeros(total + 1, hv, dv, dtype=torch.float32, device=device)  # row T absorbs padded steps
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    if num_seqs == 0 or total == 0 or int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()):
        return out32[:total].to(torch.bfloat16), new_pool

    group = hv // hq
    qf, kf = q.float(), k.float()
    qf = qf / torch.sqrt((qf * qf).sum(-1, keepdim=True) + 1e-6)
    kf = kf / torch.sqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
    q32, k32 = qf.repeat_interleave(group, dim=1), kf.repeat_interleave(group, dim=1)  # [T, HV, K]
    v32, decay, beta32 = v.float(), torch.exp(g.float()), beta.float()

    slots = state_indices.to(device=device, dtype=torch.long)
    live = (slots >= 0) & (slots < num_slots)
    start_from = live & has_initial_state.to(device=device, dtype=torch.bool)
    S = torch.zeros(num_seqs, hv, dv, dk, dtype=torch.float32, device=device)
    S[start_from] = state_pool[slots[start_from]].float()
    lengths = torch.where(live, lengths, torch.zeros_like(lengths))  # a padding sequence makes no step

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

    new_pool[slots[live]] = S[live]
    return out32[:total].to(torch.bfloat16), new_pool
