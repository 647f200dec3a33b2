"""What a longest-sequence hint would do to the pool-prefill routers (CPU, stored measurements).

The prefill routers split on total tokens, sequences and mean length, which cannot tell one long
sequence among short ones from equal lengths; the fused and two-kernel prefills run a sequence's
chunks one after another, so that is where they lose to FlashInfer. Engines know every length on the
host before the call (SGLang's `extend_seq_lens_cpu`, vLLM's `max_query_len`): a `max_seq_len`
argument would cost no device sync. This script refits each pool-prefill definition from the main
store with and without `max_seq_len` as a fourth feature (the spec's hint,
`kdispatch.workloads.hint_values`) and scores both on the held-out store (every variant
measured there, never fitted on) and by 5-fold over the main store, per call mode.

    python benchmarks/prefill_hint_fit.py [--definitions gdn_prefill_pool_qk4_v8 ...]
"""
from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

from kdispatch import definitions as defs
from kdispatch import workloads
from kdispatch.definitions.gdn.names import PACKED_HEADS, pool_prefill_name
from kdispatch.tuner import features as feats
from kdispatch.tuner import fit as fitting
from kdispatch.tuner import flows
from kdispatch.tuner.store import Store

ROOT = Path(__file__).resolve().parent.parent
SETS = ("traces/workloads", "traces/coverage", "traces/heldout")
HINT = "max_seq_len"


def hint_values(definition: str) -> dict[str, int]:
    """uuid -> its longest sequence (the spec's hint), over every workload set of the definition."""
    out = {}
    for s in SETS:
        path = ROOT / s / "workloads" / "gdn" / f"{definition}.jsonl"
        if path.exists():
            for line in path.read_text().splitlines():
                w = json.loads(line)
                out[w["workload"]["uuid"]] = workloads.hint_values(definition, w, trace_root=ROOT / s)[HINT]
    return out


def tables(definition: str, main: Store, held: Store):
    """(main, held-out) tables as `kdispatch route --check` fits and scores them."""
    quiet = io.StringIO()
    return [flows._without_unmeasured(flows._without_retired(fitting.load_table(s, definition, "sm90"), quiet), quiet)
            for s in (main, held)]


def score(definition: str, main_t, held_t, mode: str) -> str:
    policy = fitting.fit(main_t, mode=mode)
    h, k = fitting.measured_regret(policy, held_t, mode), fitting.heldout_regret(main_t, mode=mode)
    return (f"held-out {h['regret_mean_pct']:6.2f}% / {h['regret_max_pct']:6.2f}%  {h['speedup_vs_baseline']:.3f}x  "
            f"slower {h['slower_than_baseline']}  |  5-fold {k['regret_mean_pct']:6.2f}% / {k['regret_max_pct']:6.2f}%  "
            f"slower {k['slower_than_baseline']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--definitions", nargs="*", default=[pool_prefill_name(hq, hv) for hq, hv in PACKED_HEADS.values()])
    opts = ap.parse_args()
    main_store = Store.open(ROOT / "tuner/results/nvidia-h100-80gb-hbm3.sqlite")
    held_store = Store.open(ROOT / "tuner/results/heldout/nvidia-h100-80gb-hbm3.sqlite")
    plain = feats.fit_names
    print("regret vs the best variant measured (mean / max), speedup over the baseline, count slower than it")
    for name in opts.definitions:
        d = defs.resolve_name(name)
        lengths = hint_values(d)
        for hinted in (False, True):
            main_t, held_t = tables(d, main_store, held_store)
            if hinted:
                feats.fit_names = fitting.feats.fit_names = lambda x, d=d: plain(x) + ((HINT,) if x == d else ())
                for t in (main_t, held_t):
                    for u in t.uuids:
                        t.features[u][HINT] = lengths[u]
                    t.uuids.sort(key=lambda u, t=t: (tuple(t.features[u][f] for f in feats.fit_names(d)), u))
            try:
                for mode in ("graph", "eager"):
                    label = f"{defs.get(d).short} {'+ ' + HINT if hinted else '3 features':<14} {mode:<5}"
                    print(f"{label}  {score(d, main_t, held_t, mode)}", flush=True)
            finally:
                feats.fit_names = fitting.feats.fit_names = plain


if __name__ == "__main__":
    main()
