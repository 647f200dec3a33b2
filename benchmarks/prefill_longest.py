"""Where the staged prefill's walk loses to the baseline: per workload of a prefill definition, from a
results store (no GPU), the batch's longest sequence (the definition's `max_seq_len` hint), the baseline's
graph time, the fastest `cuda_prefill_staged` and `cuda_prefill_cp` configurations', and the staged time
per 16-token block of the longest sequence. The walk runs each (sequence, value head) pair's blocks in
order, so a lightly loaded GPU takes about one block time per block of the longest sequence; where that
figure grows, the walk is bound by its total work rather than by the longest sequence.

    python benchmarks/prefill_longest.py [--store tuner/results/traces/nvidia-h200.jsonl.gz]
        [--definition gdn_prefill] [--min-tokens 2000] [--traces traces traces/coverage]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kdispatch import definitions, registry, workloads  # noqa: E402


def best(times: dict, prefix: str):
    """(us, configuration) of the fastest passing row whose variant starts with `prefix`, or None."""
    found = [(t, name) for name, t in times.items() if name.startswith(prefix)]
    return min(found) if found else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default="tuner/results/traces/nvidia-h200.jsonl.gz")
    ap.add_argument("--definition", default="gdn_prefill")
    ap.add_argument("--min-tokens", type=int, default=2000)
    ap.add_argument("--traces", nargs="+", default=["traces", "traces/coverage"])
    opts = ap.parse_args()
    full = definitions.resolve_name(opts.definition)
    registry.discover()
    base = registry.baseline(full, "sm90").name
    times = collections.defaultdict(dict)  # uuid -> variant -> graph us (passing rows, the newest wins)
    with gzip.open(opts.store, "rt") as f:
        for line in f:
            row = json.loads(line)
            k = row["kdispatch"]
            if row["definition"] == full and row["evaluation"].get("status") == "PASSED" and k.get("median_us"):
                times[row["workload"]["uuid"]][row["solution"]] = k["median_us"]
    print(f"# benchmarks/prefill_longest.py --store {opts.store} --definition {opts.definition} "
          f"--min-tokens {opts.min_tokens}: graph us from the store; baseline {base}")
    print("tokens seqs longest | baseline | staged (config) | cp (config) | staged/baseline | staged us a block "
          "of the longest")
    for root in opts.traces:
        for w in workloads.load_workloads(root, full):
            t = times.get(w.uuid)
            if not t or base not in t or w.axes["total_seq_len"] < opts.min_tokens:
                continue
            longest = workloads.hint_values(full, w)["max_seq_len"]
            staged, cp = best(t, "cuda_prefill_staged"), best(t, "cuda_prefill_cp")
            if staged is None:
                continue
            cp_text = f"{cp[0]:.1f} ({cp[1].split('.')[1]})" if cp else "-"
            print(f"{w.axes['total_seq_len']} {w.axes['num_seqs']} {longest} | {t[base]:.1f} | "
                  f"{staged[0]:.1f} ({staged[1].split('.')[1]}) | {cp_text} | {staged[0] / t[base]:.2f} | "
                  f"{staged[0] / -(-longest // 16):.2f}")


if __name__ == "__main__":
    main()
