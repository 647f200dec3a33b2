"""Timing plumbing on CPU: input rotation keeps inputs valid and spreads the working set, the
number of sets follows the L2 rule, and a real job (materialise -> gate -> time) runs end to end."""
import time

import pytest
import torch

from kdispatch import definitions
from kdispatch.tuner import stats, timing
from kdispatch.tuner.job import Job, run_job
from kdispatch.workloads import materialize

DECODE, INDEXER, SPARSE = map(definitions.resolve_name, ("gdn_decode", "dsa_topk_indexer", "dsa_sparse_attention"))


def args_of(definition, axes, uuid="rot"):
    return list(materialize(definition, {"uuid": uuid, "axes": axes, "inputs": {}}, device="cpu", seed=0))


def test_state_rotation_copies_only_the_state():
    args = args_of(DECODE, {"batch_size": 2})
    n = timing.num_sets(DECODE, args, l2_bytes=50 << 20)
    assert n == min(256, -(-4 * (50 << 20) // (2 * 8 * 128 * 128 * 4)))
    sets = timing.input_sets(DECODE, args, 50 << 20, max_sets=8)
    assert len(sets) == 8
    assert all(s[3] is not args[3] and torch.equal(s[3], args[3]) for s in sets), "never the caller's state"
    assert all(s[0] is args[0] for s in sets), "other inputs are shared"


def test_indexer_rotation_moves_pages_and_keeps_them_distinct():
    args = args_of(INDEXER, {"batch_size": 3, "max_num_pages": 10, "num_pages": 100})
    sets = timing.input_sets(INDEXER, args, 1 << 20, max_sets=4)
    assert len(sets) == 4
    for s in sets[1:]:
        bt = s[4]
        assert bt.dtype == torch.int32 and bt.shape == args[4].shape
        assert not torch.equal(bt, args[4])
        assert bt.unique().numel() == bt.numel(), "a shift mod num_pages keeps pages distinct"
        assert int(bt.min()) >= 0 and int(bt.max()) < 100


def test_sparse_rotation_keeps_padding_and_slots():
    args = args_of(SPARSE, {"num_tokens": 2, "num_pages": 40})
    s = timing.rotate(SPARSE, args, 1, 4)
    old, new = args[4], s[4]
    assert torch.equal(old == -1, new == -1)
    valid = old >= 0
    assert torch.equal(old[valid] % 64, new[valid] % 64)
    assert not torch.equal(old, new) and int(new.max()) < 40 * 64


def test_moe_rotation_keeps_routing_inside_groups():
    x = torch.randn(5, 256)
    y = timing.rotate("moe_fp8", [x, None], 3, 8)[0]
    assert torch.equal(y.view(5, 8, 32).sort(dim=2).values, x.view(5, 8, 32).sort(dim=2).values)
    assert not torch.equal(x, y)


def test_a_long_baseline_tail_does_not_hide_a_clear_win():
    """The margin is the two half spreads; a host-synchronising baseline timed eagerly can have a
    p90 several times its median. Ranges apart (and by the minimum gain) still count."""
    base = stats.Timed(533.5, 493.7, 2164.9)  # the sparse-attention reference, eager, 9 tokens (H100)
    fast = stats.Timed(55.2, 52.4, 62.4)
    assert stats.beats(fast, base, 0.03) and stats.slower(base, fast, 0.03)
    close = stats.Timed(520.0, 480.0, 560.0)  # overlapping ranges: no verdict either way
    assert not stats.beats(close, base, 0.03) and not stats.slower(close, base, 0.03)
    apart_by_little = stats.Timed(100.0, 99.0, 100.5)  # apart, but by less than the minimum gain
    assert not stats.beats(apart_by_little, stats.Timed(102.0, 101.0, 103.0), 0.03)


def test_a_replay_calls_the_sets_of_its_host_and_device_budgets():
    """`graph_sets`: all the sets where they fit both budgets; a long device call keeps fewer (each set
    then too small for a warm cache to matter), a host-heavy one too; never fewer than 2 or more than n."""
    b = timing.Budget()
    assert timing.graph_sets(200, eager_us=60.0, device_us=50.0, budget=b) == 200  # 10 ms of device time
    assert timing.graph_sets(200, eager_us=1100.0, device_us=1000.0, budget=b) == 50  # 0.05 s of 1 ms calls
    assert timing.graph_sets(200, eager_us=5000.0, device_us=30.0, budget=b) == 50  # 0.25 s of host-heavy calls
    assert timing.graph_sets(200, eager_us=19000.0, device_us=18000.0, budget=b) == 2
    assert timing.graph_sets(1, eager_us=19000.0, device_us=18000.0, budget=b) == 1


def test_percentile():
    assert stats.percentile([1, 2, 3, 4, 5], 0.5) == 3
    assert abs(stats.percentile([0, 10], 0.1) - 1.0) < 1e-12


def test_run_job_end_to_end_on_cpu():
    rows, starts = [], []

    def emit(kind, *payload):
        (rows if kind == "result" else starts).append(payload[0] if kind == "result" else payload)

    work = Job(DECODE, [{"uuid": "job-1", "axes": {"batch_size": 2}, "inputs": {}}],
                     {"job-1": ["reference", "no_such_variant"]}, device="cpu", quick=True)
    run_job(work, emit)
    by = {r["variant"]: r for r in rows}
    assert by["reference"]["status"] == "PASSED" and by["reference"]["method"] == "cpu"
    assert by["reference"]["median_us"] > 0 and by["reference"]["sets"] >= 1
    assert by["no_such_variant"]["status"] == "RUNTIME_ERROR"
    assert (None, "job-1") in starts and ("reference", "job-1") in starts
    m = by["reference"]["metrics"]  # where the tune's time went, per row
    assert m["inputs_s"] > 0 and m["gate_s"] > 0 and m["timing_s"] > 0


def test_every_variant_of_a_workload_is_gated_against_untouched_inputs():
    """Timing one variant must not change the inputs the next one is checked on (in-place state)."""
    from kdispatch import registry
    from kdispatch.registry import Variant

    ref = registry.get(DECODE, "reference").fn
    registry.register(Variant(DECODE, "ref_twin", lambda *a: ref(*a), "torch", ("cpu",)))
    rows = []
    try:
        work = Job(DECODE, [{"uuid": "job-2", "axes": {"batch_size": 2}, "inputs": {}}],
                         {"job-2": ["reference", "ref_twin", "routed"]}, device="cpu", quick=True)
        run_job(work, lambda kind, *p: rows.append(p[0]) if kind == "result" else None)
    finally:
        registry.unregister(DECODE, "ref_twin")
    assert [(r["variant"], r["status"]) for r in rows] == [("reference", "PASSED"), ("ref_twin", "PASSED"),
                                                           ("routed", "PASSED")], [r["reason"] for r in rows]
    assert rows[2]["metrics"]["routed_to"] == "reference"


def test_a_guarded_baseline_is_gated_as_served_and_timed_as_the_engine_calls_it():
    """A library baseline registered with `engine=` passes the gate on its own (guarded) call; the
    row's timing runs the engine's call, which the plugins hand baseline-routed calls to, and the
    guarded call's times (what kdispatch.ops runs) go beside them in the metrics."""
    from kdispatch import registry

    ref = registry.get(DECODE, "reference").fn
    served, engine, engine_result = [], [], []

    def guarded(*a):
        served.append(1)
        time.sleep(0.002)  # the guard's extra launch, exaggerated: its times must be told apart
        return ref(*a)

    def as_the_engine_calls_it(*a):  # its result is never gated: a cached one keeps its time far below the guard's
        engine.append(1)
        if not engine_result:
            engine_result.append(ref(*a))
        return engine_result[0]

    with pytest.raises(ValueError, match="only a library baseline"):
        registry.variant(DECODE, "not_a_baseline", backend="torch", archs=("cpu",), engine=as_the_engine_calls_it)
    registry.variant(DECODE, "guarded_library", backend="library", archs=("cpu",), baseline=True,
                     engine=as_the_engine_calls_it)(guarded)
    rows = []
    try:
        work = Job(DECODE, [{"uuid": "job-3", "axes": {"batch_size": 2}, "inputs": {}}],
                   {"job-3": ["guarded_library"]}, device="cpu", quick=True)
        run_job(work, lambda kind, *p: rows.append(p[0]) if kind == "result" else None)
    finally:
        registry.unregister(DECODE, "guarded_library")
    assert rows[0]["status"] == "PASSED", rows[0]["reason"]
    assert served and engine
    assert rows[0]["metrics"]["timed"].startswith("the engine's own call")
    g = rows[0]["metrics"]["guarded"]
    assert g["median_us"] > rows[0]["median_us"] + 1000 and g["eager_us"] > rows[0]["eager_us"] + 1000


def test_eager_calls_take_turns_so_a_slow_spell_hits_every_variant_alike():
    """Each round calls every callable once, in a shuffled order; a slow spell of the host (here the
    first ten calls) lands on both of two equal callables, where timing one after the other would
    put all of it on the first."""
    order, calls = [], [0]

    def make(name):
        def fn(*_):
            order.append(name)
            calls[0] += 1
            if calls[0] <= 10:
                time.sleep(0.003)
        return fn

    times = timing.eager_rounds_us({"a": make("a"), "b": make("b")}, [[torch.zeros(1)]], rounds=10)
    assert all(sorted(order[i:i + 2]) == ["a", "b"] for i in range(0, 20, 2)), order  # each round calls both
    assert len({tuple(order[i:i + 2]) for i in range(0, 20, 2)}) == 2, order  # in either order
    slow = {n: sum(t > 2500 for t in x) for n, x in times.items()}
    assert 2 <= slow["a"] <= 8 and slow["a"] + slow["b"] == 10, times
