"""The tuner's graph timing on the GPU (tuner/timing.py `graph_times_us`): a replay must do the
captured work, and a call that writes into its inputs the same values every time still counts as
doing it (a prefill of fresh sequences: outputs and states depend on the inputs only)."""
import pytest
import torch

from kdispatch.tuner.timing import WorkEscaped, graph_times_us

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _sets(n=3):
    return [[torch.randn(1024, device="cuda"), torch.empty(1024, device="cuda")] for _ in range(n)]


def test_an_in_place_output_rewritten_with_the_same_values_is_work_done():
    def deterministic(x, out):
        torch.mul(x, 2.0, out=out)  # the same values on every replay
        return out

    sets = _sets()
    times, reps = graph_times_us(deterministic, sets)
    assert reps >= 3 and all(t > 0 for t in times)
    for x, out in sets:  # restored after the check, and then rewritten by the timed replays
        assert torch.equal(out, x * 2.0)


def test_an_in_place_output_left_unwritten_on_replay_is_escaped_work():
    def host_side(x, out):
        return out  # nothing captured: a replay writes nothing

    with pytest.raises(WorkEscaped):
        graph_times_us(host_side, _sets())


def test_a_fresh_output_left_unwritten_on_replay_is_escaped_work():
    cached = {}

    def memoised(x, out):
        if "y" not in cached:  # computed during the warm-up, outside the capture
            cached["y"] = x * 2.0
        return cached["y"]

    with pytest.raises(WorkEscaped):
        graph_times_us(memoised, _sets())


def test_the_screen_times_a_capturable_call_in_both_modes_and_flags_one_that_is_not():
    from kdispatch.tuner.timing import screen_us

    x, out = torch.randn(1 << 22, device="cuda"), torch.empty(1 << 22, device="cuda")
    small, big = screen_us(lambda x, o: torch.mul(x[:1024], 2.0, out=o[:1024]), [x, out]), \
        screen_us(lambda x, o: [torch.mul(x, 2.0, out=o) for _ in range(20)][-1], [x, out])
    assert all(t is not None and t > 0 for t in small + big)
    assert big[0] > 2 * small[0]  # 20 passes over 16 MB against one over 4 KB

    def syncs(x, o):
        torch.mul(x, float(x[0].item() * 0 + 2.0), out=o)  # a host sync: cannot be captured
        return o

    graph, eager = screen_us(syncs, [x, out])
    assert graph is None and eager > 0
    # the failed capture left torch's CUDA generator usable: a draw on the device still works
    assert torch.isfinite(torch.randn(16, device="cuda")).all()


def test_the_tuners_screen_on_the_gpu_leaves_out_only_the_far_slower(monkeypatch):
    """tuner/job.py `screen` with real CUDA calls: a variant 20x the work is left out, one at the
    fastest's speed and the baseline are kept, one that cannot be captured and is slow eagerly too is
    left out with no graph time."""
    from kdispatch.tuner import job

    def scale(passes, sync=False):
        def fn(x, out):
            for _ in range(passes):
                torch.mul(x, float(x[0].item() * 0 + 2.0) if sync else 2.0, out=out)
            return out
        return fn

    calls = {"base": scale(2), "fast": scale(1), "slow": scale(40), "syncs": scale(40, sync=True)}
    monkeypatch.setattr(job, "resolve_fn", lambda d, name, w=None: calls[name])
    monkeypatch.setattr(job, "timed_fn", lambda d, name, fn: fn)
    monkeypatch.setattr(job.gate, "private_copy", lambda d, args: list(args))
    args = [torch.randn(1 << 24).cuda(), torch.empty(1 << 24, device="cuda")]  # 64 MB: HBM-bound
    out = job.screen("gdn_decode", "base", list(calls), args, 2.0)
    assert set(out) == {"slow", "syncs"}
    assert out["syncs"]["graph_us"] is None and out["slow"]["graph_us"] > 20 * out["slow"]["best_graph_us"] / 2


def test_a_long_call_replays_only_the_sets_of_its_device_budget():
    """tuner/timing.py `graph_sets`: a one-sequence decode rotates 256 state copies (0.5 MB each, for 4x
    the L2); at about 1 ms of device time a call, one replay calls only 0.05 s of them."""
    from kdispatch import definitions
    from kdispatch.tuner.timing import Budget, measure
    from kdispatch.workloads import materialize

    name = definitions.resolve_name("gdn_decode")
    args = list(materialize(name, {"uuid": "sets", "axes": {"batch_size": 1}, "inputs": {}}, device="cuda", seed=0))

    def slow(*a):
        torch.cuda._sleep(2_000_000)  # about 1 ms at ~2 GHz
        return a[0] * 2.0

    t = measure(name, slow, args, Budget(target_s=0.01))
    assert t.method == "graph", t
    assert 2 <= t.sets <= int(0.05e6 / (0.5 * t.median_us)), t  # within the budget even at half the measured time
    assert t.sets < 256
