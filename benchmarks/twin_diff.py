"""The same variants' rows in two versions of a results store's twin (tuner/results/traces/*.jsonl.gz), side
by side: for each (definition, variant) measured in both, the new graph median over the old one on every
workload the two share (median, 10th and 90th percentile, the worst and best workload). A partial re-tune
after a kernel change tells from this whether the change moved shapes an A/B did not time; variants whose
code did not change, re-measured in the same runs, show the drift between the runs (a control).

    python benchmarks/twin_diff.py --old REV --new REV2 [--twin tuner/results/traces/nvidia-h200.jsonl.gz]
        [--variants cuda_prefill_] [--definitions prefill] [--by total_seq_len --edges 256 2048]

--by AXIS --edges E ...: also every variant's ratios together (those whose name starts with --by-variants),
in bins of a workload axis (below the first edge, between edges, from the last on).

REV / REV2: git revisions holding the twin (or paths to twin files); rows of the new one count only where
measured after every row of the old one.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
from pathlib import Path


def rows_of(source: str, twin: str, variants: str, definitions: str) -> dict:
    """(definition, variant, uuid) -> (graph median us, workload axes, timestamp) of the passing rows."""
    path = Path(source)
    data = path.read_bytes() if path.exists() else subprocess.run(
        ["git", "show", f"{source}:{twin}"], check=True, capture_output=True).stdout
    out = {}
    for line in gzip.decompress(data).decode().splitlines():
        r = json.loads(line)
        k = r["kdispatch"]
        if not (r["solution"].startswith(variants) and definitions in r["definition"]):
            continue
        if r["evaluation"]["status"] != "PASSED" or k.get("median_us") is None:
            continue
        out[(r["definition"], r["solution"], r["workload"]["uuid"])] = (
            k["median_us"], r["workload"]["axes"], r["evaluation"]["timestamp"])
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--twin", default="tuner/results/traces/nvidia-h200.jsonl.gz")
    ap.add_argument("--variants", default="", help="variant name prefix")
    ap.add_argument("--definitions", default="", help="a part of the definitions' names")
    ap.add_argument("--by", help="a workload axis to bin the ratios by")
    ap.add_argument("--edges", nargs="+", type=int, default=[], help="the bins' edges along --by")
    ap.add_argument("--by-variants", default="", help="variant name prefix of the binned rows")
    a = ap.parse_args(argv)
    old = rows_of(a.old, a.twin, a.variants, a.definitions)
    new = rows_of(a.new, a.twin, a.variants, a.definitions)
    since = max((t for _m, _a, t in old.values()), default="")
    pairs: dict[tuple[str, str], list] = {}
    for key, (m, axes, t) in new.items():
        if t > since and key in old:
            pairs.setdefault(key[:2], []).append((m / old[key][0], axes, old[key][0], m))
    print(f"new / old graph median, rows of {a.new} measured after {since} against {a.old}")
    print(f"{'definition':<42} {'variant':<28} {'n':>4} {'median':>7} {'p10':>6} {'p90':>6}  worst; best")
    for (d, v), xs in sorted(pairs.items()):
        rs = sorted(x[0] for x in xs)
        w, b = max(xs, key=lambda x: x[0]), min(xs, key=lambda x: x[0])
        shape = lambda x: ",".join(f"{k}={x[1][k]}" for k in sorted(x[1]))  # noqa: E731
        print(f"{d:<42} {v:<28} {len(rs):>4} {statistics.median(rs):>7.3f} {rs[len(rs) // 10]:>6.3f} "
              f"{rs[9 * len(rs) // 10]:>6.3f}  {w[0]:.2f} {shape(w)} {w[2]:.1f}->{w[3]:.1f}; "
              f"{b[0]:.2f} {shape(b)} {b[2]:.1f}->{b[3]:.1f}")
    if a.by:
        bins: dict[int, list[float]] = {}
        for (_d, v), xs in pairs.items():
            for x in xs:
                if v.startswith(a.by_variants) and a.by in x[1]:
                    bins.setdefault(sum(x[1][a.by] >= e for e in a.edges), []).append(x[0])
        names = [f"< {a.edges[0]}" if a.edges else "all"] + [
            f"{lo} .. {hi - 1}" for lo, hi in zip(a.edges, a.edges[1:])] + ([f">= {a.edges[-1]}"] if a.edges else [])
        print(f"\n{a.by_variants or 'every variant'}* rows by {a.by}: n, median, p10, p90 of new / old")
        for i in sorted(bins):
            rs = sorted(bins[i])
            print(f"{a.by} {names[i]:<14} {len(rs):>5} {statistics.median(rs):>7.3f} {rs[len(rs) // 10]:>6.3f} "
                  f"{rs[9 * len(rs) // 10]:>6.3f}")


if __name__ == "__main__":
    main()
