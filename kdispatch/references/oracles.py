"""Faster equivalents of references, for the tuner's correctness gate (tuner/gate.py `reference`).

The GDN prefill references walk one token at a time: about ten launches a token, so a 32k-token
sequence costs seconds a trial, and building the references took over half of a prefill re-tune
(H100, 2026-11-26). Here the same recurrence is evaluated 64 tokens at a time, exactly in exact
arithmetic and in float64 (more precise than the references' float32 walk): within a chunk of a
sequence, with G the running sum of the log decays from the chunk's start and S0 its entry state,

    delta_s = beta_s (v_s - exp(G_s) S0 k_s - sum_{j<s} exp(G_s - G_j) (k_s . k_j) delta_j)
              (a unit lower-triangular solve for the chunk's deltas)
    o_t     = scale (exp(G_t) S0 q_t + sum_{s<=t} exp(G_t - G_s) (q_t . k_s) delta_s)
    S_end   = exp(G_end) S0 + sum_s exp(G_end - G_s) outer(delta_s, k_s)

Steps past a sequence's end get no decay and no write (a no-op), so the sequences a chunk reaches
advance through it together, as the references advance them through a step. Everything else (the
gates, the normalisation, padding and malformed batches, where final states are written) restates
the references' code: a reference's text is its definition's, run standalone by FlashInfer-Bench, so
it cannot share helpers; tests/test_oracles.py holds each oracle to its reference on fresh random
inputs, those cases included.
"""
import math

import torch
import torch.nn.functional as F

from kdispatch import definitions
from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, gathered_prefill_name
from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name

CHUNK = 64


def _chunked(q, k, v, log_decay, beta, S, starts, lengths, scale: float):
    """The delta rule over packed sequences, float64. q, k: [T, HV, K] (per value head), v: [T, HV, V],
    log_decay, beta: [T, HV]; S: [N, HV, V, K] entry states (updated, returned); starts, lengths: [N]
    (a sequence of length 0 makes no step). Returns (out [T, HV, V], S)."""
    total, hv, dv = v.shape
    device = v.device
    out = torch.zeros(total + 1, hv, dv, dtype=torch.float64, device=device)  # row T absorbs steps past an end
    max_len = int(lengths.max()) if lengths.numel() else 0
    pos = torch.arange(CHUNK, device=device)
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=device).tril()
    strict = lower.tril(-1)
    eye = torch.eye(CHUNK, dtype=torch.float64, device=device)
    for c0 in range(0, max_len, CHUNK):
        n = torch.nonzero(lengths > c0).squeeze(1)  # the sequences this chunk reaches (one long among short ones)
        active = (c0 + pos)[None, :] < lengths[n, None]  # [n, C]
        tok = torch.where(active, starts[n, None] + c0 + pos[None, :], torch.full_like(active, total, dtype=torch.long))
        src = tok.clamp(max=total - 1)
        Q, K, V = (x[src].transpose(1, 2) for x in (q, k, v))  # [n, HV, C, D]
        on = active[:, None, :]
        g = torch.where(on, log_decay[src].transpose(1, 2), 0.0)  # [n, HV, C]
        b = torch.where(on, beta[src].transpose(1, 2), 0.0)
        G = g.cumsum(-1)
        diff = G[..., :, None] - G[..., None, :]  # G_t - G_s
        decay_ts = torch.exp(torch.where(lower, diff, -math.inf))  # zero above the diagonal
        A = b[..., None] * (K @ K.transpose(-1, -2)) * torch.where(strict, decay_ts, 0.0)
        S0 = S[n]
        rhs = b[..., None] * (V - torch.exp(G)[..., None] * (K @ S0.transpose(-1, -2)))
        delta = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)  # [n, HV, C, V]
        O = scale * (torch.exp(G)[..., None] * (Q @ S0.transpose(-1, -2))
                     + ((Q @ K.transpose(-1, -2)) * decay_ts) @ delta)
        out[tok] = O.transpose(1, 2)
        g_end = G[..., -1]
        S[n] = torch.exp(g_end)[..., None, None] * S0 + \
            (delta * torch.exp(g_end[..., None] - G)[..., None]).transpose(-1, -2) @ K
    return out[:total], S


def _unit(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


@torch.no_grad()
def gdn_prefill_pool(q, k, v, g, beta, state_pool, state_indices, has_initial_state, cu_seqlens, out, scale):
    """kdispatch.references.gdn_prefill_pool.run, 64 tokens a step."""
    total, hq, dk = q.shape
    num_slots, hv, dv, _ = state_pool.shape
    num_seqs = cu_seqlens.shape[0] - 1
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(dk)
    device = q.device
    new_pool = state_pool.clone()
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    if num_seqs == 0 or total == 0 or int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()):
        return torch.zeros(total, hv, dv, dtype=torch.bfloat16, device=device), new_pool
    group = hv // hq
    q64 = _unit(q.double()).repeat_interleave(group, dim=1)
    k64 = _unit(k.double()).repeat_interleave(group, dim=1)
    slots = state_indices.to(device=device, dtype=torch.long)
    live = (slots >= 0) & (slots < num_slots)
    start_from = live & has_initial_state.to(device=device, dtype=torch.bool)
    S = torch.zeros(num_seqs, hv, dv, dk, dtype=torch.float64, device=device)
    S[start_from] = state_pool[slots[start_from]].double()
    lengths = torch.where(live, lengths, torch.zeros_like(lengths))  # a padding sequence makes no step
    o, S = _chunked(q64, k64, v.double(), g.double(), beta.double(), S, starts, lengths, float(scale))
    new_pool[slots[live]] = S[live].float()
    return o.to(torch.bfloat16), new_pool


@torch.no_grad()
def gdn_prefill_gathered(q, k, v, g, beta, initial_state, cu_seqlens, out, scale):
    """kdispatch.references.gdn_prefill_gathered.run, 64 tokens a step."""
    total, hq, dk = q.shape
    num_seqs, hv, dv, _ = initial_state.shape
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(dk)
    device = q.device
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    if num_seqs == 0 or total == 0 or int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()):
        return torch.zeros(total, hv, dv, dtype=torch.bfloat16, device=device), initial_state.float().clone()
    group = hv // hq
    o, S = _chunked(q.double().repeat_interleave(group, dim=1), k.double().repeat_interleave(group, dim=1),
                    v.double(), g.double(), beta.double(), initial_state.double(), starts, lengths, float(scale))
    return o.to(torch.bfloat16), S.float()


@torch.no_grad()
def gdn_prefill(q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, scale):
    """kdispatch.references.gdn_prefill.run, 64 tokens a step."""
    total, num_q_heads, head_k = q.shape
    num_v_heads, head_v = v.shape[1], v.shape[2]
    num_seqs = cu_seqlens.shape[0] - 1
    if scale is None or float(scale) == 0.0:
        scale = 1.0 / math.sqrt(head_k)
    device = q.device
    S = (torch.zeros(num_seqs, num_v_heads, head_v, head_k, dtype=torch.float32, device=device) if state is None
         else state.float().clone())
    zeros = torch.zeros(total, num_v_heads, head_v, dtype=torch.bfloat16, device=device)
    if num_seqs == 0 or total == 0:
        return zeros, S
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    starts, lengths = cu[:-1], cu[1:] - cu[:-1]
    if int(cu[0]) != 0 or int(cu[-1]) != total or bool((lengths < 0).any()):
        return zeros, S
    group = num_v_heads // num_q_heads
    log_decay = -torch.exp(A_log.double()) * F.softplus(a.double() + dt_bias.double())
    o, S64 = _chunked(q.double().repeat_interleave(group, dim=1), k.double().repeat_interleave(group, dim=1),
                      v.double(), log_decay, torch.sigmoid(b.double()), S.double(), starts, lengths, float(scale))
    return o.to(torch.bfloat16), S64.float()


# definition name -> its oracle (the gate falls back to the reference for every other definition)
ORACLES = {
    definitions.get("gdn_prefill").name: gdn_prefill,
    **{pool_prefill_name(hq, hv): gdn_prefill_pool for hq, hv in PACKED_HEADS.values()},
    **{gathered_prefill_name(hq, hv): gdn_prefill_gathered for hq, hv in GATHERED_HEADS.values()},
}
