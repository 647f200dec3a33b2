"""Where a tune's time went, from the store: per definition, the seconds spent on each workload's
inputs and reference trials (shared by its variants), on the variants' correctness gates and on
their timing, from the metrics `kdispatch tune` records per row (rows measured before it recorded
them are left out), the slowest variants last.

    python benchmarks/tune_time.py [--store tuner/results/<device>.sqlite] [--top 12]
"""
from __future__ import annotations

import argparse
import collections

from kdispatch import definitions as defs
from kdispatch.tuner.flows import open_stores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", nargs="*", default=None, help="store(s); default: every store under tuner/results/")
    ap.add_argument("--top", type=int, default=12, help="slowest (definition, variant) pairs to list")
    opts = ap.parse_args()
    store = open_stores(opts.store)
    per_def = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])  # inputs, gate, timing, rows
    per_variant = collections.Counter()
    for name in defs.names():
        inputs = {}
        for r in store.results(name):
            m = r.metrics or {}
            if "gate_s" not in m:
                continue
            inputs[r.uuid] = max(inputs.get(r.uuid, 0.0), m["inputs_s"])  # once per workload and run
            acc = per_def[name]
            acc[1] += m["gate_s"]
            acc[2] += m["timing_s"]
            acc[3] += 1
            per_variant[(defs.get(name).short, r.variant)] += m["gate_s"] + m["timing_s"]
        if name in per_def:
            per_def[name][0] = sum(inputs.values())
    total = sum(sum(v[:3]) for v in per_def.values())
    print(f"{'definition':<28}{'rows':>6}{'inputs+ref s':>14}{'gates s':>10}{'timing s':>10}{'share':>8}")
    for name, (i, g, t, n) in sorted(per_def.items(), key=lambda kv: -sum(kv[1][:3])):
        print(f"{defs.get(name).short:<28}{n:>6}{i:>14.0f}{g:>10.0f}{t:>10.0f}{(i + g + t) / max(total, 1e-9):>8.0%}")
    print(f"{'all':<28}{sum(v[3] for v in per_def.values()):>6}{total:>34.0f} s = {total / 60:.1f} min "
          "(summed over workers)")
    print("\nslowest variants (gate + timing):")
    for (short, variant), s in per_variant.most_common(opts.top):
        print(f"  {short:<28}{variant:<34}{s:>8.0f} s")


if __name__ == "__main__":
    main()
