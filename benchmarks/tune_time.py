"""What a tune of today's set costs, from the store: the (variant, workload) pairs a tune from an empty
store would measure (the registered variants, each at its latest measured source hash, on the
workloads of the trace sets), and per definition the seconds spent on each workload's inputs and
reference trials (shared by its variants), on the variants' correctness gates and on their timing,
from the metrics `kdispatch tune` records per row (pairs measured before it recorded them are
counted, not timed), the slowest variants last. Worker start-up and compiles outside a gate are
not in the rows: a tune takes longer than these sums. Each workload's screen (tuner/job.py: rough
times that leave far slower variants ungated and untimed) counts once per workload, like its inputs,
in a column of its own; where the rows recorded it, it is split into its first calls (compiles) and
its rough times. The gate
seconds beyond each variant's median gate, by backend, are mostly first calls' compiles (Triton,
NVRTC, the libraries' JITs): what a parallel precompile could take off.

`--screen F` also estimates what screening at factor F saves on rows measured in full: the pairs
whose graph and eager times are both over F times the fastest passing variant's on their workload
(the screen decides on rough times, so this is an estimate), and their timing seconds plus their
gate's up to the variant's median gate: a gate longer than that is mostly the first call's compile,
which the screen's first call pays as well.

Rows keep the timing seconds of the protocol they were measured under (the replay target fell from
0.2 to 0.05 s on 2026-11-27, after most H100 rows). The timing is also projected for today's
protocol (tuner/timing.py `measure` with `Budget()`) from each timed row's own times: its first
call, probe and eager calls, the capture's host pass (eager less graph time a call) and the replays, at
the row's recorded sets cut as `graph_sets` cuts them today (`--replay-call-s S` projects another
device-time cut); not the input sets' creation.

    python benchmarks/tune_time.py [--store tuner/results/<device>.sqlite] [--workloads traces traces/coverage]
                                   [--screen 2] [--replay-call-s 0.05]
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import math
import statistics

from kdispatch import definitions as defs
from kdispatch import registry
from kdispatch.tuner.flows import open_stores
from kdispatch.tuner.cli import TUNE_SETS
from kdispatch.tuner.plan import workload_dicts
from kdispatch.tuner.timing import SLOW_US, Budget, graph_sets


def current_rows(store, name: str, roots) -> list:
    """The newest row of each (registered variant, workload of `roots`) pair, at the variant's
    newest measured hash."""
    uuids = {w["uuid"] for w in workload_dicts(roots, name)}
    names = {v.name for v in registry.variants(name)}
    rows = [r for r in store.results(name) if r.uuid in uuids and r.variant in names]
    newest_hash = {}
    for r in sorted(rows, key=lambda r: r.measured_at):
        newest_hash[r.variant] = r.variant_hash
    latest = {}
    for r in rows:
        k = (r.variant, r.uuid)
        if r.variant_hash == newest_hash[r.variant] and (k not in latest or r.measured_at > latest[k].measured_at):
            latest[k] = r
    return list(latest.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", nargs="*", default=None, help="store(s); default: every store under tuner/results/")
    ap.add_argument("--workloads", nargs="*", default=list(TUNE_SETS), help="trace sets (default: what tune measures)")
    ap.add_argument("--top", type=int, default=12, help="slowest (definition, variant) pairs to list")
    ap.add_argument("--screen", type=float, help="estimate what screening at this factor saves (module docstring)")
    ap.add_argument("--replay-call-s", type=float, help="project the timing with this replay cut (module docstring)")
    opts = ap.parse_args()
    budget = Budget() if opts.replay_call_s is None else dataclasses.replace(Budget(), replay_call_s=opts.replay_call_s)
    projected = 0.0  # seconds of timing today's protocol would take on the timed rows
    store = open_stores(opts.store)
    registry.discover()
    per_def = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0, 0])  # inputs, screen, gate, timing, timed, pairs
    screen_split = [0.0, 0.0]  # the screen's first calls (compiles), its rough times: rows that recorded them
    per_variant = collections.Counter()
    saved = [0, 0.0, 0.0]  # pairs a screen would skip, their seconds, the seconds of every timed pair
    compiles = collections.Counter()  # backend -> gate seconds beyond its variant's median gate
    for name in defs.names():
        inputs, screens = {}, {}
        acc = per_def[name]
        rows = current_rows(store, name, opts.workloads)
        for r in rows:
            acc[5] += 1
            m = r.metrics or {}
            if "inputs_s" in m:  # once per workload and run
                inputs[r.uuid] = max(inputs.get(r.uuid, 0.0), m["inputs_s"])
                screens[r.uuid] = max(screens.get(r.uuid, 0.0), m.get("screen_s", 0.0))
            screen_split[0] += m.get("screen_first_s", 0.0)
            screen_split[1] += m.get("screen_rough_s", 0.0)
            if "gate_s" not in m:
                continue
            acc[2] += m["gate_s"]
            acc[3] += m["timing_s"]
            acc[4] += 1
            projected += _projected_timing_s(r, budget)
            per_variant[(defs.get(name).short, r.variant)] += m["gate_s"] + m["timing_s"]
        acc[0], acc[1] = sum(inputs.values()), sum(screens.values())
        for variant, gates in _gates(rows).items():
            typical = statistics.median(gates)
            compiles[_backend(name, variant)] += sum(g - typical for g in gates if g > typical)
        if opts.screen:
            for n, s in _screened_in_full(rows, opts.screen):
                saved[0] += n
                saved[1] += s
            saved[2] += acc[2] + acc[3]
    total = sum(sum(v[:4]) for v in per_def.values())
    print(f"{'definition':<30}{'pairs':>7}{'timed':>7}{'inputs+ref s':>14}{'screen s':>10}{'gates s':>10}"
          f"{'timing s':>10}{'share':>8}")
    for name, (i, sc, g, t, n, p) in sorted(per_def.items(), key=lambda kv: -sum(kv[1][:4])):
        print(f"{defs.get(name).short:<30}{p:>7}{n:>7}{i:>14.0f}{sc:>10.0f}{g:>10.0f}{t:>10.0f}"
              f"{(i + sc + g + t) / max(total, 1e-9):>8.0%}")
    print(f"{'all':<30}{sum(v[5] for v in per_def.values()):>7}{sum(v[4] for v in per_def.values()):>7}"
          f"{total:>44.0f} s = {total / 60:.1f} min (summed over workers)")
    timed_s = sum(v[3] for v in per_def.values())
    print(f"timing as recorded {timed_s:.0f} s; projected under today's protocol (replay_call_s {budget.replay_call_s:g}) "
          f"{projected:.0f} s = {projected / 60:.1f} min")
    if any(screen_split):
        print(f"the screen's first calls (compiles the gates would pay otherwise) {screen_split[0]:.0f} s, "
              f"its rough times {screen_split[1]:.0f} s (rows that recorded them)")
    print("gates beyond each variant's median gate (mostly first-call compiles): " +
          ", ".join(f"{b} {sec:.0f} s" for b, sec in compiles.most_common()))
    if opts.screen:
        print(f"\nscreening at {opts.screen:g}x would skip about {saved[0]} pairs measured in full, {saved[1]:.0f} of "
              f"{saved[2]:.0f} s of gates and timing ({saved[1] / max(saved[2], 1e-9):.0%})")
    print("\nslowest variants (gate + timing):")
    for (short, variant), s in per_variant.most_common(opts.top):
        print(f"  {short:<30}{variant:<34}{s:>8.0f} s")


def _projected_timing_s(r, budget: Budget) -> float:
    """Seconds `measure` would take on row r today (its first call and probe, its eager calls, then one
    event-timed call, the two warm-ups, the capture's host pass, the checked and warm replays and
    `reps` replays; or event-timed calls)."""
    eager = max(r.eager_us or r.median_us, 1.0)
    calls = 3 + int(min(budget.eager_max, max(budget.eager_min, budget.eager_target_s * 1e6 // eager)))
    if not r.method.startswith("graph"):
        calls += int(min(20, max(3, math.ceil(2 * budget.target_s * 1e6 / eager))))
        return calls * eager / 1e6
    sets = graph_sets(r.sets, eager, r.median_us, budget) if eager < SLOW_US else r.sets
    replay_s = r.median_us * sets / 1e6
    reps = int(min(budget.max_reps, max(budget.min_reps, math.ceil(budget.target_s / max(replay_s, 1e-6)))))
    host = max(eager - r.median_us, 5.0)  # a captured call costs its host part only
    return (calls + 3) * eager / 1e6 + sets * host / 1e6 + (2 + reps) * replay_s


def _gates(rows) -> dict[str, list[float]]:
    """variant -> the gate seconds of its rows that recorded them."""
    gates = collections.defaultdict(list)
    for r in rows:
        if "gate_s" in (r.metrics or {}):
            gates[r.variant].append(r.metrics["gate_s"])
    return gates


def _backend(definition: str, variant: str) -> str:
    try:
        return registry.get(definition, variant).backend
    except KeyError:
        return "retired"


def _screened_in_full(rows, factor: float):
    """(1, seconds saved) for each row measured in full whose graph and eager times are both over
    `factor` times the fastest passing row's on its workload (never the baseline's)."""
    by_uuid = collections.defaultdict(list)
    for r in rows:
        by_uuid[r.uuid].append(r)
    typical_gate = {v: statistics.median(g) for v, g in _gates(rows).items()}
    for rs in by_uuid.values():
        timed = [r for r in rs if r.passed and r.eager_us]
        if not timed:
            continue
        best_graph, best_eager = min(r.median_us for r in timed), min(r.eager_us for r in timed)
        for r in timed:
            if not r.baseline and r.median_us > factor * best_graph and r.eager_us > factor * best_eager:
                gate_s = r.metrics.get("gate_s", 0.0)
                yield 1, min(gate_s, typical_gate.get(r.variant, gate_s)) + r.metrics.get("timing_s", 0.0)


if __name__ == "__main__":
    main()
