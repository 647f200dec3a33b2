"""benchmarks/tune_time.py's projection of a row's timing under today's protocol (tuner/timing.py
`measure`): graph rows pay their replays, cut sets and host pass; event-timed rows their calls."""
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import tune_time  # noqa: E402
from kdispatch.tuner.timing import Budget  # noqa: E402


def row(method="graph", median_us=1000.0, eager_us=1100.0, sets=200):
    return SimpleNamespace(method=method, median_us=median_us, eager_us=eager_us, sets=sets)


def test_a_long_graph_row_replays_only_the_sets_of_its_device_budget():
    b = Budget()
    eager_part = (3 + 45 + 3) * 1100e-6  # first call and probe, 0.05 s of 1.1 ms calls, an event call, two warm-ups
    # 1 ms of device time a call: 0.05 s keeps 50 of the 200 sets, 0.2 keeps all (the host cut, 0.25 s
    # of 1.1 ms calls, would keep 227); replays to min_reps plus the checked and warm ones; 100 us host a set
    assert tune_time._projected_timing_s(row(), b) == pytest.approx(eager_part + 50 * 100e-6 + 5 * 0.05)
    assert tune_time._projected_timing_s(row(), replace(b, replay_call_s=0.2)) == pytest.approx(
        eager_part + 200 * 100e-6 + 5 * 0.2)


def test_a_short_graph_row_replays_to_the_target_and_an_events_row_times_calls():
    b = Budget()
    short = tune_time._projected_timing_s(row(median_us=10.0, eager_us=30.0, sets=100), b)
    # 1 ms a replay: 50 reps (+2) of it, 50 eager calls (the cap) of 30 us, a 20 us host pass per set
    assert short == pytest.approx((3 + 50 + 3) * 30e-6 + 100 * 20e-6 + 52 * 1e-3)
    events = tune_time._projected_timing_s(row(method="events", median_us=30000.0, eager_us=30000.0), b)
    assert events == pytest.approx((3 + 5 + 4) * 0.03)  # probe + eager_min calls, then 4 event-timed calls
