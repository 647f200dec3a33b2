"""Gated DeltaNet prefill in vLLM's convention (kdispatch reference): sequences packed along the
token axis, q and k normalised and the gates activated by the caller, one initial state per
sequence, gathered by the caller out of its pool (zeros where a sequence starts fresh); the final
states replace the initial ones.

Sequence n owns tokens cu_seqlens[n] .. cu_seqlens[n+1]-1 and starts from initial_state[n]. For
every token t, per value head h (q/k head h // (HV / HQ)), with the state S of shape [V, K] (k-last):

    S     = exp(g_t) * S                      g: the log decay the caller computed, fp32
    S     = S + outer(beta_t * (v_t - S @ k_t), k_t)
    o_t   = scale * S @ q_t

The recurrence walks time steps 0 .. max_len-1 once, advancing every sequence and head together.
All math in float32; outputs are rounded to bfloat16 once. Malformed boundaries (cu_seqlens[0] != 0,
a decreasing step, or cu_seqlens[N] != T) are a whole-batch no-op: zero output, the states
unchanged. The caller's tensors are never written: the final states are a fresh tensor.
"""
import math

import torch


@torch.no_grad()
def run(q, k, v, g, beta, initial_state, cu_seqlens, out, scale):
    """Gated delta-rule prefill from gathered states.

    Args:
        q: [T, HQ, 128] bfloat16, queries, L2-normalised by the caller.   k: [T, HQ, 128] bfloat16, keys, likewise.
        v: [T, HV, 128] bfloat16, values.
        g: [T, HV] float32, log decay per token and value head (decay = exp(g), g <= 0).
        beta: [T, HV] float32, write strength per token and value head.
        initial_state: [N, HV, 128, 128] float32, each sequence's k-last state before the batch.
        cu_seqlens: [N + 1] int32, sequence boundaries.
        out: [T, HV, 128] bfloat16, where the ops write the output (not read here).
        scale: float (None or 0: 1/sqrt(128)).

    Returns:
        output: [T, HV, 128] bfloat16.
        final_state: [N, HV, 128, 128] float32, each sequence's state after its last token.
    """
    total, hq, dk = q.shape
    num_seqs, hv, dv, _ = initial_state.shape
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(dk)
    device = q.device
    out32 = torch.zeros(total + 1, hv, dv, dtype=torch.float32, device=device)  # row T absorbs padded steps
    S = initial_state.float().clone()
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    if num_seqs == 0 or total == 0 or int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()):
        return out32[:total].to(torch.bfloat16), S

    group = hv // hq
    q32, k32 = q.float().repeat_interleave(group, dim=1), k.float().repeat_interleave(group, dim=1)  # [T, HV, K]
    v32, decay, beta32 = v.float(), torch.exp(g.float()), beta.float()

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

    return out32[:total].to(torch.bfloat16), S
