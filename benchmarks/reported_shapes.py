"""The shapes a user reported as mis-routed (issue 15's table, H100, 2026-11-23), as a workload set:

    python benchmarks/reported_shapes.py --out /tmp/reported
    python -m kdispatch.cli bench --workloads /tmp/reported --json reported.json

`bench` measures every variant and the routed op there, in both call modes, so each row's "routed
within 5% of the best passing variant" reads off its table. Prefill length mixes are the coverage
set's random ones (seeded by the shape).
"""
from __future__ import annotations

import argparse
import json
import sys
import uuid as uuidlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traces.build import _trace, _write_set, mixed_inputs  # noqa: E402

REPORTED = {
    "gdn_prefill": [{"total_seq_len": 6000, "num_seqs": 60}, {"total_seq_len": 960, "num_seqs": 24},
                    {"total_seq_len": 300, "num_seqs": 1}, {"total_seq_len": 1000, "num_seqs": 1}],
    "dsa_topk_indexer": [{"batch_size": 64, "max_num_pages": 160, "num_pages": 16384}],
    "dsa_sparse_attention": [{"num_tokens": t, "num_pages": 16384} for t in (9, 32, 128)],
    "moe_fp8": [{"seq_len": 4096}],
    "gdn_decode": [{"batch_size": b} for b in (12, 24, 40)],
}


def main() -> None:
    from kdispatch import definitions

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    opts = ap.parse_args()
    for short, shapes in REPORTED.items():
        name = definitions.resolve_name(short)
        defn, spec = definitions.load(name), definitions.get(name).spec
        traces, blob = [], {}
        for axes in shapes:
            uuid = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"kdispatch/reported/{name}/{json.dumps(axes, sort_keys=True)}"))
            traces.append(_trace(defn, axes, mixed_inputs(defn, spec, axes, "random", uuid, blob), uuid))
        _write_set(opts.out, defn, definitions.path(name), traces, blob, set())
    print(f"wrote {sum(map(len, REPORTED.values()))} workloads under {opts.out}")


if __name__ == "__main__":
    main()
