"""What a tune of today's set costs, from the store: the (variant, workload) pairs a tune from an empty
store would measure (the registered variants, each at its latest measured source hash, on the
workloads of the trace sets), and per definition the seconds spent on each workload's inputs and
reference trials (shared by its variants), on the variants' correctness gates and on their timing,
from the metrics `kdispatch tune` records per row (pairs measured before it recorded them are
counted, not timed), the slowest variants last. Worker start-up and compiles outside a gate are
not in the rows: a tune takes longer than these sums.

    python benchmarks/tune_time.py [--store tuner/results/<device>.sqlite] [--workloads traces traces/coverage]
"""
from __future__ import annotations

import argparse
import collections

from kdispatch import definitions as defs
from kdispatch import registry
from kdispatch.tuner.flows import open_stores
from kdispatch.tuner.cli import TUNE_SETS
from kdispatch.tuner.plan import workload_dicts


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
    opts = ap.parse_args()
    store = open_stores(opts.store)
    registry.discover()
    per_def = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0, 0])  # inputs, gate, timing, timed, pairs
    per_variant = collections.Counter()
    for name in defs.names():
        inputs = {}
        acc = per_def[name]
        for r in current_rows(store, name, opts.workloads):
            acc[4] += 1
            m = r.metrics or {}
            if "gate_s" not in m:
                continue
            inputs[r.uuid] = max(inputs.get(r.uuid, 0.0), m["inputs_s"])  # once per workload and run
            acc[1] += m["gate_s"]
            acc[2] += m["timing_s"]
            acc[3] += 1
            per_variant[(defs.get(name).short, r.variant)] += m["gate_s"] + m["timing_s"]
        acc[0] = sum(inputs.values())
    total = sum(sum(v[:3]) for v in per_def.values())
    print(f"{'definition':<30}{'pairs':>7}{'timed':>7}{'inputs+ref s':>14}{'gates s':>10}{'timing s':>10}{'share':>8}")
    for name, (i, g, t, n, p) in sorted(per_def.items(), key=lambda kv: -sum(kv[1][:3])):
        print(f"{defs.get(name).short:<30}{p:>7}{n:>7}{i:>14.0f}{g:>10.0f}{t:>10.0f}{(i + g + t) / max(total, 1e-9):>8.0%}")
    print(f"{'all':<30}{sum(v[4] for v in per_def.values()):>7}{sum(v[3] for v in per_def.values()):>7}"
          f"{total:>34.0f} s = {total / 60:.1f} min (summed over workers)")
    print("\nslowest variants (gate + timing):")
    for (short, variant), s in per_variant.most_common(opts.top):
        print(f"  {short:<30}{variant:<34}{s:>8.0f} s")


if __name__ == "__main__":
    main()
