"""Gated DeltaNet decode in the serving engines' convention (kdispatch reference): one new token per
request, q/k/v packed in one row and not yet normalised, the recurrent states in a pool of slots.

Per row i of the batch with slot s = state_indices[i] (a padding row when s is outside
[0, num_slots): its output is zero and no state is read or written), and per value head h (q/k head
h // (HV / HQ)):

    q, k  = x / sqrt(sum(x * x) + 1e-6)  for the row's q and k heads     L2 norm, in the op
    g     = exp(-exp(A_log[h]) * softplus(a + dt_bias[h]))                decay in (0, 1)
    beta  = sigmoid(b)                                                    write strength
    S     = g * state_pool[s, h]                                          [V, K] (k-last)
    S     = S + outer(beta * (v - S @ k), k)                              delta-rule correction
    o     = scale * S @ q;  state_pool[s, h] = S

All math in float32; the output is rounded to bfloat16 once. Every valid slot is read before any is
written (two rows naming one slot both start from its old state; which new state lands is not
specified). The caller's tensors are never written: the new pool is a fresh tensor.
"""
import math

import torch
import torch.nn.functional as F


@torch.no_grad()
def run(mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out, scale):
    """One decode step over a state pool.

    Args:
        mixed_qkv: [B, (2 HQ + HV) * D] bfloat16, per row all q heads, then all k heads, then all
            v heads, D = 128 each; q and k raw (normalised here).
        a: [B, HV] bfloat16, decay logit.   b: [B, HV] bfloat16, write-gate logit.
        A_log: [HV] float32.   dt_bias: [HV] float32.
        state_pool: [num_slots, HV, D, D] float32, k-last states.
        state_indices: [B] int32, the slot of each row; outside [0, num_slots): padding.
        out: [B, 1, HV, D] bfloat16, where the ops write the output (not read here).
        scale: float (None or 0: 1/sqrt(D)).

    Returns:
        output: [B, 1, HV, D] bfloat16.
        new_state_pool: [num_slots, HV, D, D] float32, the pool after the step.
    """
    batch = mixed_qkv.shape[0]
    num_slots, hv, dv, dk = state_pool.shape
    hq = (mixed_qkv.shape[1] - hv * dv) // (2 * dk)
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(dk)
    x = mixed_qkv.float()
    q = x[:, :hq * dk].reshape(batch, hq, dk)
    k = x[:, hq * dk:2 * hq * dk].reshape(batch, hq, dk)
    v = x[:, 2 * hq * dk:].reshape(batch, hv, dv)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    group = hv // hq
    q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)  # [B, HV, K]

    slots = state_indices.long()
    live = (slots >= 0) & (slots < num_slots)
    S = torch.zeros(batch, hv, dv, dk, dtype=torch.float32, device=mixed_qkv.device)
    S[live] = state_pool[slots[live]].float()

    decay = torch.exp(-torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float()))  # [B, HV]
    beta = torch.sigmoid(b.float())
    S = S * decay[:, :, None, None]
    recalled = torch.matmul(S, k.unsqueeze(-1)).squeeze(-1)  # [B, HV, V]
    S = S + (beta.unsqueeze(-1) * (v - recalled)).unsqueeze(-1) * k.unsqueeze(-2)
    o = float(scale) * torch.matmul(S, q.unsqueeze(-1)).squeeze(-1)  # [B, HV, V]
    o = torch.where(live[:, None, None], o, torch.zeros_like(o))

    new_pool = state_pool.clone()
    new_pool[slots[live]] = S[live]
    return o.unsqueeze(1).to(torch.bfloat16), new_pool
