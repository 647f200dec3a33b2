"""GDN speculative verification in SGLang's convention (gdn_verify_*): the reference agrees with the
pool prefill's on the same tokens (outputs, and each cached step's state is the prefill's final
state after that many tokens), never writes the pool, stores only where its rules say; SGLang's own
verify kernel (its Triton code, under TRITON_INTERPRET on the CPU) called as the baseline calls it
matches the reference. GPU: tests/gpu/test_gdn_verify_gpu.py."""
import importlib.util

import pytest
import torch

from kdispatch import registry
from kdispatch.workloads import materialize

NAME = "gdn_verify_qk4_v8"
Q, K, V, A, B, A_LOG, DT_BIAS, POOL, IDX, CU, INTER, ROWS, SCALE = range(13)


def verify_args(seqs=9, steps=3, seed=0):
    w = {"axes": {"num_seqs": seqs, "cache_steps": steps, "total_seq_len": seqs * steps, "num_slots": seqs + 1,
                  "num_cache_rows": seqs}, "inputs": {}, "uuid": f"verify-{seqs}-{steps}"}
    return list(materialize(NAME, w, seed=seed))


def reference(args):
    return registry.get(NAME, "reference").fn(*[x.clone() if torch.is_tensor(x) else x for x in args])


def prefill_reference(args, tokens: int):
    """The pool prefill reference on the first `tokens` tokens of every request, gates activated as
    the engine does, every live request continuing its slot: (output, new pool)."""
    n, steps = args[IDX].shape[0], args[INTER].shape[1]
    keep = (torch.arange(n * steps).view(n, steps)[:, :tokens]).reshape(-1)
    x = args[A][keep].float() + args[DT_BIAS]
    g = -torch.exp(args[A_LOG]) * torch.nn.functional.softplus(x)
    beta = torch.sigmoid(args[B][keep].float())
    live = (args[IDX] >= 0) & (args[IDX] < args[POOL].shape[0])
    cu = torch.arange(n + 1, dtype=torch.int32) * tokens
    pool = args[POOL].clone()
    return registry.get("gdn_prefill_pool_qk4_v8", "reference").fn(
        args[Q][keep], args[K][keep], args[V][keep], g, beta, pool, args[IDX], live, cu,
        torch.empty(n * tokens, 8, 128, dtype=torch.bfloat16), args[SCALE])


def test_reference_agrees_with_the_pool_prefill():
    args = verify_args()
    pool_before = args[POOL].clone()
    out, inter = reference(args)
    assert torch.equal(args[POOL], pool_before)
    rows = args[ROWS]
    for tokens in (1, 2, 3):
        p_out, p_pool = prefill_reference(args, tokens)
        got = out.view(9, 3, 8, 128)[:, :tokens].reshape(-1, 8, 128)
        live = (args[IDX] >= 0).repeat_interleave(tokens)
        torch.testing.assert_close(got[live].float(), p_out[live].float(), rtol=0, atol=1e-2)
        for n in range(9):
            if rows[n] >= 0 and args[IDX][n] >= 0:
                torch.testing.assert_close(inter[rows[n], tokens - 1], p_pool[args[IDX][n]], rtol=1e-5, atol=1e-5)
    assert int((rows < 0).sum()) == 1 and torch.equal(inter[int(torch.arange(9)[~torch.isin(torch.arange(9), rows)][0])],
                                                      torch.zeros(3, 8, 128, 128)), "the padding request's row"


def test_padding_requests_start_from_zeros_and_long_requests_store_nothing():
    args = verify_args(seqs=4, steps=3, seed=1)
    zero_slot = [x.clone() if torch.is_tensor(x) else x for x in args]
    zero_slot[POOL][args[IDX][1]] = 0
    args[IDX][1] = 1 << 20  # outside the pool: starts from zeros
    torch.testing.assert_close(reference(args)[0], reference(zero_slot)[0], rtol=0, atol=0)
    args[CU] = torch.tensor([0, 1, 2, 7, 12], dtype=torch.int32)  # requests 2, 3 longer than a row's 3 steps
    before = args[INTER].clone()
    _, inter = reference(args)
    for n in (2, 3):
        assert torch.equal(inter[args[ROWS][n]], before[args[ROWS][n]])
    assert not torch.equal(inter[args[ROWS][0], 0], before[args[ROWS][0], 0])


def test_malformed_boundaries_read_as_the_even_partition():
    args = verify_args(seqs=4, steps=3, seed=2)
    want = reference(args)
    args[CU] = torch.tensor([0, 5, 2, 9, 12], dtype=torch.int32)
    got = reference(args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="SGLang not installed")
def test_sglang_verify_kernel_as_the_baseline_calls_it():
    from kdispatch.kernels.library.gdn import sglang

    args = verify_args(seqs=5, steps=3, seed=4)
    args[IDX][2] = -1  # padding: SGLang starts it from zeros, as the reference
    args[ROWS][3] = -1  # not stored
    want_out, want_inter = reference(args)
    inter = args[INTER].clone()
    out, got_inter = sglang.verify_call(args[Q], args[K], args[V], args[A], args[B], args[A_LOG], args[DT_BIAS],
                                        args[POOL], args[IDX], args[CU], inter, args[ROWS], args[SCALE])
    assert got_inter is inter
    torch.testing.assert_close(out.float(), want_out.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(inter, want_inter, rtol=1e-4, atol=1e-4)


def test_vllm_convention_agrees_with_sglangs():
    """gdn_verify_steps (vLLM) on SGLang's inputs: starting from the slot of the accepted step, the
    states it writes into the step slots are SGLang's cached steps; padding requests output zeros."""
    args = verify_args(seqs=9, steps=3, seed=6)
    want_out, want_inter = reference(args)
    pool = args[POOL]
    n, steps = 9, 3
    step_slots = torch.zeros(n, steps, dtype=torch.int32)
    accepted = torch.randint(1, steps + 1, (n,), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    big = torch.zeros(1 + n * steps + pool.shape[0], *pool.shape[1:])  # slot 0 null, step slots, then SGLang's
    for r in range(n):
        step_slots[r] = torch.arange(1 + r * steps, 1 + (r + 1) * steps, dtype=torch.int32)
        if args[IDX][r] >= 0:  # the accepted step's slot holds the request's state
            big[step_slots[r, accepted[r] - 1]] = pool[args[IDX][r]]
        else:
            step_slots[r] = 0  # padding in vLLM's convention
    got_out, got_pool = registry.get("gdn_verify_steps_qk4_v8", "reference").fn(
        args[Q], args[K], args[V], args[A], args[B], args[A_LOG], args[DT_BIAS], big.clone(), step_slots, accepted,
        args[CU], args[SCALE])
    for r in range(n):
        rows = slice(r * steps, (r + 1) * steps)
        if args[IDX][r] < 0:
            assert torch.equal(got_out[rows], torch.zeros_like(got_out[rows]))
            continue
        torch.testing.assert_close(got_out[rows], want_out[rows], rtol=0, atol=0)
        if args[ROWS][r] >= 0:
            torch.testing.assert_close(got_pool[step_slots[r].long()], want_inter[args[ROWS][r]], rtol=0, atol=0)
    assert torch.equal(got_pool[0], big[0]), "the null slot"
