"""Build the shipped FlashInfer-Bench dataset of every MLSys-2026 contest workload.

    python traces/build.py [--axes-dir ../shared/fib/contest-axes]

Reads `<axes-dir>/<definition>.csv` (the contest's workload uuids and variable-axis values; other
columns, such as published latencies, are ignored) and writes, next to this script:

    definitions/<op_type>/<name>.json    byte copies of kdispatch/definitions/<op_type>/<name>.json
    workloads/<op_type>/<name>.jsonl     one workload trace per CSV row, in CSV order:
        {"definition": name, "workload": {"axes": {...}, "inputs": {...}, "uuid": ...},
         "solution": null, "evaluation": null}

Every tensor input is `{"type": "random"}`: the contest's safetensors blobs (real sequence lengths,
sparse indices, routing logits, states) are not available, and `kdispatch.workloads.materialize`
turns "random" into valid, realistic inputs (FlashInfer-Bench's own generator would give plain noise
for index tensors). Scalars carry the served models' values, each spec's `model_scalars`:
GDN scale = 1/sqrt(128); sparse attention sm_scale = 1/sqrt(192); MoE routed_scaling_factor = 2.5
and local_expert_offset = 0 for every workload: the synthetic routing is symmetric over the 256
experts, so each of the 8 EP ranks sees the same token -> expert mass and spreading the offsets over
ranks would change nothing but the bookkeeping.

Deterministic: the output depends only on the CSVs and the definitions; rerunning rewrites the
same bytes and removes stale .json/.jsonl files under definitions/ and workloads/.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_AXES_DIR = REPO.parent / "shared" / "fib" / "contest-axes"


def workload_traces(defn: dict, csv_path: Path, scalars: dict) -> list[dict]:
    """One workload-trace dict per CSV row; ValueError on a missing axis, a bad value or a broken
    axis constraint."""
    var_axes = [k for k, a in defn["axes"].items() if a["type"] == "var"]
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{csv_path}: no workloads")
    columns = set(rows[0])
    missing = [a for a in var_axes + ["uuid"] if a not in columns]
    if missing:
        raise ValueError(f"{csv_path}: no column for {missing}")
    traces, seen = [], set()
    for i, row in enumerate(rows, start=2):
        uuid = row["uuid"].strip()
        if not uuid or uuid in seen:
            raise ValueError(f"{csv_path}:{i}: empty or duplicate uuid {uuid!r}")
        seen.add(uuid)
        axes = {}
        for a in var_axes:
            value = int(row[a])
            if value < 0 or str(value) != row[a].strip():
                raise ValueError(f"{csv_path}:{i}: axis {a} = {row[a]!r} is not a non-negative integer")
            axes[a] = value
        if "len_cu_seqlens" in axes and axes["len_cu_seqlens"] != axes["num_seqs"] + 1:
            raise ValueError(f"{csv_path}:{i}: len_cu_seqlens != num_seqs + 1")
        inputs = {}
        for name, spec in defn["inputs"].items():
            if spec["shape"] is None:
                if name not in scalars:
                    raise ValueError(f"{defn['name']}: no model value for scalar input {name!r}")
                inputs[name] = {"type": "scalar", "value": scalars[name]}
            else:
                inputs[name] = {"type": "random"}
        traces.append({"definition": defn["name"],
                       "workload": {"axes": axes, "inputs": inputs, "uuid": uuid},
                       "solution": None, "evaluation": None})
    return traces


def build(axes_dir: Path, out_dir: Path = HERE) -> dict[str, int]:
    """Writes the dataset under out_dir; returns {definition name: workload count}."""
    from kdispatch import definitions

    written: set[Path] = set()
    counts = {}
    for name in definitions.names():
        defn = definitions.load(name)
        csv_path = axes_dir / f"{name}.csv"
        if not csv_path.is_file():
            raise FileNotFoundError(f"no contest axes for {name}: {csv_path}")
        traces = workload_traces(defn, csv_path, definitions.get(name).spec.model_scalars)

        def_out = out_dir / "definitions" / defn["op_type"] / f"{name}.json"
        def_out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(definitions.path(name), def_out)
        wl_out = out_dir / "workloads" / defn["op_type"] / f"{name}.jsonl"
        wl_out.parent.mkdir(parents=True, exist_ok=True)
        wl_out.write_text("".join(json.dumps(t) + "\n" for t in traces))
        written |= {def_out, wl_out}
        counts[name] = len(traces)

    for sub, pattern in (("definitions", "*.json"), ("workloads", "*.jsonl")):
        for p in (out_dir / sub).rglob(pattern):
            if p not in written:
                p.unlink()
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--axes-dir", type=Path, default=DEFAULT_AXES_DIR,
                    help=f"folder of <definition>.csv files (default {DEFAULT_AXES_DIR})")
    ap.add_argument("--out", type=Path, default=HERE, help="dataset root (default: this folder)")
    args = ap.parse_args(argv)
    counts = build(args.axes_dir, args.out)
    for name, n in counts.items():
        print(f"{n:4d}  {name}")
    print(f"{sum(counts.values()):4d}  workloads in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
