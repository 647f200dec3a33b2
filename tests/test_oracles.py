"""The tuner gate's oracles (kdispatch/references/oracles.py) against the references they stand in
for, on fresh random inputs: sequences longer than a chunk, padding slots, sequences with and
without an initial state, empty sequences, malformed boundaries."""
import pytest
import torch

from kdispatch import definitions, registry
from kdispatch.references.oracles import ORACLES
from kdispatch.workloads import SimpleWorkload, materialize

POOL = "gdn_prefill_pool_qk2_v4"
SHAPES = {
    POOL: [{"total_seq_len": 150, "num_seqs": 3, "num_slots": 5}, {"total_seq_len": 70, "num_seqs": 1, "num_slots": 2},
           {"total_seq_len": 9, "num_seqs": 4, "num_slots": 6}],
    "gdn_prefill": [{"total_seq_len": 140, "num_seqs": 3}, {"total_seq_len": 65, "num_seqs": 1}],
}


def call(short, axes, seed):
    name = definitions.get(short).name
    return name, list(materialize(name, SimpleWorkload(axes, uuid=f"oracle-{short}-{seed}"), "cpu", seed))


def agree(name, args):
    want = registry.get(name, registry.REFERENCE).fn(*[x.clone() if isinstance(x, torch.Tensor) else x for x in args])
    got = ORACLES[name](*[x.clone() if isinstance(x, torch.Tensor) else x for x in args])
    (o_ref, s_ref), (o, s) = want, got
    assert o.dtype == o_ref.dtype and o.shape == o_ref.shape and s.dtype == s_ref.dtype and s.shape == s_ref.shape
    assert torch.isfinite(o.float()).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o.float(), o_ref.float(), rtol=1e-2, atol=2e-3)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-5)
    return o, s


def test_every_oracle_names_a_definition_with_a_reference():
    for name in ORACLES:
        assert registry.get(name, registry.REFERENCE) is not None


@pytest.mark.parametrize("short", sorted(SHAPES))
def test_oracles_match_their_references(short):
    registry.discover()
    for seed, axes in enumerate(SHAPES[short]):
        name, args = call(short, axes, seed)
        o, _ = agree(name, args)
        assert o.float().abs().max() > 0, "a test on all-zero outputs could not fail"


def test_pool_oracle_on_padding_slots_fresh_states_and_empty_sequences():
    registry.discover()
    name, args = call(POOL, {"total_seq_len": 130, "num_seqs": 4, "num_slots": 6}, 7)
    names = [n for n, _ in definitions.get(name).data["inputs"].items()]
    idx, init, cu = (names.index(n) for n in ("state_indices", "has_initial_state", "cu_seqlens"))
    args[idx] = args[idx].clone()
    args[idx][1] = -1  # a padding sequence
    args[init] = torch.tensor([True, True, False, True])
    agree(name, args)
    empty = args[cu].clone()
    empty[2] = empty[1]  # an empty sequence
    agree(name, args[:cu] + [empty] + args[cu + 1:])
    bad = args[cu].clone()
    bad[-1] += 1  # malformed: the whole batch is a no-op
    o, s = agree(name, args[:cu] + [bad] + args[cu + 1:])
    assert not o.float().any()


def test_the_gate_uses_the_oracle(monkeypatch):
    from kdispatch.tuner import gate

    registry.discover()
    name, args = call(POOL, SHAPES[POOL][2], 0)
    used = []
    monkeypatch.setitem(ORACLES, name, lambda *a, _f=ORACLES[name]: used.append(1) or _f(*a))
    gate.reference(name, args)
    assert used == [1]
