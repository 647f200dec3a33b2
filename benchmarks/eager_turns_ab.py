"""A definition's rows measured twice on one GPU model, each variant's eager calls in its own loop and
in turns with the workload's other variants (`kdispatch tune --eager-turns --force`): per variant the
host part of the eager time (eager - graph) over the workloads both measured; per workload how far
apart the eager times of configurations sharing one host path are (the drift each protocol leaves;
`--same-host`); and the routers fitted on each, scored on held-out rows measured the same way (and
the own-loop fit on the turns' held-out rows). No GPU needed. Stores are .sqlite files or their
trace-line twins; the H200's own-loop rows of the definitions re-measured in turns on 2026-11-29 are
the twins before that (git show db404b9:tuner/results/traces/nvidia-h200.jsonl.gz > own.jsonl.gz,
the same for tuner/results/heldout/traces/):

    python benchmarks/eager_turns_ab.py gdn_decode --own own.jsonl.gz --own-heldout own-heldout.jsonl.gz \\
        --turns tuner/results/traces/nvidia-h200.jsonl.gz --turns-heldout tuner/results/heldout/traces/nvidia-h200.jsonl.gz \\
        --same-host cuda_decode_warp_rows. [--unpaired]
"""
from __future__ import annotations

import argparse
import io
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kdispatch import definitions  # noqa: E402
from kdispatch.tuner import fit as fitting  # noqa: E402
from kdispatch.tuner.flows import check_routers, fit_policies  # noqa: E402
from kdispatch.tuner.plan import workload_dicts  # noqa: E402
from kdispatch.tuner.stats import percentile, timed  # noqa: E402
from kdispatch.tuner.store import Store  # noqa: E402


def _store(path: str) -> Store:
    if path.endswith(".jsonl.gz") or path.endswith(".jsonl"):
        s = Store(":memory:")
        s.load_jsonl(path)
        return s
    return Store.open(path)


def _unpaired(path: str) -> Store:
    """The rows of `path` in memory without their calls' pairing with the baseline's (metrics
    "eager_paired"): what the eager fit compares where rows lack it (tuner/fit.py)."""
    s, mem = _store(path), Store(":memory:")
    s.db.backup(mem.db)
    mem.db.execute("UPDATE result SET metrics = json_remove(metrics, '$.eager_paired')")
    return mem


def _times(store: Store, name: str) -> dict:
    """(variant, uuid) -> (graph, eager) median us, the newest device's rows."""
    t = fitting.load_table(store, name, "sm90")
    t = t.on_device(t.devices[0]["device"])
    out = {}
    for key, r in t.rows.items():
        g, e = timed(r, "graph"), timed(r, "eager")
        if g is not None and e is not None:
            out[key] = (g.median_us, e.median_us)
    return out


def _same_host_gaps(prefix: str, a: dict, b: dict, both: list) -> None:
    print(f"the eager times of the `{prefix}*` configurations (one host path) per workload, max / min - 1:")
    for label, x in (("own loop", a), ("turns", b)):
        gaps = []
        for u in sorted({k[1] for k in both}):
            es = [x[k][1] for k in both if k[1] == u and k[0].startswith(prefix)]
            if len(es) > 1:
                gaps.append(max(es) / min(es) - 1)
        print(f"  {label:9s} median {100 * statistics.median(gaps):5.1f}%, p90 {100 * percentile(gaps, .9):5.1f}% "
              f"({len(gaps)} workloads)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("definition")
    ap.add_argument("--own", required=True)
    ap.add_argument("--own-heldout", required=True)
    ap.add_argument("--turns", required=True)
    ap.add_argument("--turns-heldout", required=True)
    ap.add_argument("--same-host", help="name prefix of the configurations sharing one host path (default: no such table)")
    ap.add_argument("--unpaired", action="store_true",
                    help="also the turns rows fitted without their pairing with the baseline's calls (eager_paired)")
    opts = ap.parse_args()
    name = definitions.resolve_name(opts.definition)
    own, turns = _store(opts.own), _store(opts.turns)
    a, b = _times(own, name), _times(turns, name)
    both = sorted(set(a) & set(b))
    print(f"{name}: {len(both)} (variant, workload) pairs in both; host = eager - graph, us: p10 / median / p90")
    print(f"  {'variant':34s} {'own loop':>22s}   {'turns':>22s}")
    for v in sorted({k[0] for k in both}):
        ha = [a[k][1] - a[k][0] for k in both if k[0] == v]
        hb = [b[k][1] - b[k][0] for k in both if k[0] == v]
        print(f"  {v:34s} " + "   ".join(f"{percentile(h, .1):6.1f} {statistics.median(h):6.1f} {percentile(h, .9):6.1f}"
                                          for h in (ha, hb)))
    if opts.same_host:
        _same_host_gaps(opts.same_host, a, b, both)
    uuids = {name: [w["uuid"] for w in workload_dicts(["traces", "traces/coverage"], name)]}
    print("routers fitted on each (this device's rows alone), scored on held-out rows: regret mean / max %, "
          "speedup over the baseline, slower than it")
    for label, fit_store, check in (("own loop, checked on own-loop rows", own, opts.own_heldout),
                                    ("turns, checked on turns rows", turns, opts.turns_heldout),
                                    ("own loop, checked on turns rows", own, opts.turns_heldout),
                                    *((("turns unpaired, checked on turns rows", _unpaired(opts.turns), opts.turns_heldout),)
                                      if opts.unpaired else ())):
        done = [(d, None, p) for _a, d, p in fit_policies(fit_store, "sm90", [name], uuids, io.StringIO())]
        r = check_routers(done, _store(check), io.StringIO())[name]
        print(f"  {label:36s} " + "  ".join(
            f"{m} {r[m]['regret_mean_pct']:.2f} / {r[m]['regret_max_pct']:.2f}, {r[m]['speedup_vs_baseline']:.3f}x, "
            f"{r[m]['slower_than_baseline']}" for m in ("graph", "eager")))
        policy = done[0][2]
        print(f"  {'':36s} eager regions: " + ", ".join(
            f"{'..'.join('' if x is None else str(x) for x in next(iter(reg.bounds.values()), (None, None)))} {reg.variant}"
            for reg in policy.eager.regions))


if __name__ == "__main__":
    main()
