"""Build the shipped FlashInfer-Bench datasets: every MLSys-2026 contest workload, and the coverage
and held-out sets of the shapes serving engines send.

    python traces/build.py [--axes-dir ../shared/fib/contest-axes]

Reads `<axes-dir>/<definition>.csv` (the contest's workload uuids and variable-axis values; other
columns, such as published latencies, are ignored; the engine-convention definitions, tagged
`convention:...`, have none) and writes, next to this script:

    definitions/<op_type>/<name>.json    byte copies of kdispatch/definitions/<op_type>/<name>.json
    workloads/<op_type>/<name>.jsonl     one workload trace per CSV row, in CSV order:
        {"definition": name, "workload": {"axes": {...}, "inputs": {...}, "uuid": ...},
         "solution": null, "evaluation": null}

and two more datasets of the same layout, sampled from each spec's `coverage` ranges:

    coverage/   tuned on besides the contest's (`kdispatch tune` measures both): a log-spaced grid
                where one axis varies, else the corners of the box and stratified log-uniform draws
    heldout/    never tuned on: log-uniform draws from the same ranges (other seeds), for
                `kdispatch bench --workloads traces/heldout`
    <set>/blob/<op_type>/<name>.safetensors   inputs a shape's mix fixes (prefill `cu_seqlens` of the
                "skewed" and "equal" length mixes), one tensor per workload, keyed `<uuid>/<input>`

Sampling is seeded by (set, definition name); uuids are derived from (set, definition, axes, mix),
so a changed range gives new uuids (and new measurements) rather than new axes under old uuids. A
shape measured in one mix only (the draws; a grid shape that `one_mix` says every mix gives alike)
takes the mix its place in the list picks, so a grid inserted before others renames those: new grids
go at the end of `more_grids`.

Every tensor input is `{"type": "random"}`: the contest's safetensors blobs (real sequence lengths,
sparse indices, routing logits, states) are not available, and `kdispatch.workloads.materialize`
turns "random" into valid, realistic inputs (FlashInfer-Bench's own generator would give plain noise
for index tensors). Scalars carry the served models' values, each spec's `model_scalars`:
GDN scale = 1/sqrt(128); sparse attention sm_scale = 1/sqrt(192); MoE routed_scaling_factor = 2.5
and local_expert_offset = 0 for every workload: the synthetic routing is symmetric over the 256
experts, so each of the 8 EP ranks sees the same token -> expert mass and spreading the offsets over
ranks would change nothing but the bookkeeping.

Deterministic: the output depends only on the CSVs, the definitions and their specs; rerunning
rewrites the same bytes and removes stale files under definitions/, workloads/ and blob/.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import random
import shutil
import sys
import uuid as uuidlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_AXES_DIR = REPO.parent / "shared" / "fib" / "contest-axes"
SAMPLED_SETS = ("coverage", "heldout")  # sub-datasets sampled from the specs' coverage ranges
DATASET_FILES = ("definitions/**/*.json", "workloads/**/*.jsonl", "blob/**/*.safetensors")


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
        traces.append(_trace(defn, axes, input_specs(defn, scalars), uuid))
    return traces


def input_specs(defn: dict, scalars: dict) -> dict:
    """Every input as "random", scalars as the served model's values."""
    inputs = {}
    for name, spec in defn["inputs"].items():
        if spec["shape"] is None:
            if name not in scalars:
                raise ValueError(f"{defn['name']}: no model value for scalar input {name!r}")
            inputs[name] = {"type": "scalar", "value": scalars[name]}
        else:
            inputs[name] = {"type": "random"}
    return inputs


def _trace(defn: dict, axes: dict, inputs: dict, uuid: str) -> dict:
    return {"definition": defn["name"], "workload": {"axes": axes, "inputs": inputs, "uuid": uuid},
            "solution": None, "evaluation": None}


# ----------------------------------------------------------------------------------------------
# Coverage and held-out sets
# ----------------------------------------------------------------------------------------------

def _log_value(lo: int, hi: int, u: float) -> int:
    """The integer at fraction u of [lo, hi] on a log scale."""
    return min(hi, max(lo, round(math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))))))


def sample_shapes(coverage, which: str, rng: random.Random) -> list[dict]:
    """The drawn axes of one set (`complete`d), distinct, in drawing order.

    coverage: one axis -> `points` distinct log-spaced values; several -> every valid corner of the box,
    then stratified draws (each axis's log range cut into as many strata as draws, each stratum
    used once, strata paired at random) until `points`; then the products of `grid` and `more_grids`
    (after the draws, so that adding a grid leaves them as they were). heldout: `heldout` log-uniform
    draws."""
    names = list(coverage.ranges)
    want = coverage.points if which == "coverage" else coverage.heldout
    out: list[dict] = []

    def add(axes: dict) -> bool:
        full = coverage.complete(dict(axes))
        if full is None or full in out:
            return False
        out.append(full)
        return True

    if which == "coverage" and len(names) == 1:
        lo, hi = coverage.ranges[names[0]]
        steps = want  # more steps where rounding merges the first few values
        while len({_log_value(lo, hi, i / max(steps - 1, 1)) for i in range(steps)}) < min(want, hi - lo + 1):
            steps += 1
        for i in range(steps):
            add({names[0]: _log_value(lo, hi, i / max(steps - 1, 1))})
    elif which == "coverage":
        for corner in range(2 ** len(names)):
            add({n: coverage.ranges[n][(corner >> k) & 1] for k, n in enumerate(names)})
    tries = 0
    while len(out) < want:
        left = want - len(out)
        strata = {n: rng.sample(range(left), left) for n in names}
        for i in range(left):
            tries += 1
            if tries > 100 * want:
                raise ValueError(f"cannot draw {want} distinct valid shapes from {coverage.ranges}")
            if which == "coverage":
                add({n: _log_value(*coverage.ranges[n], (strata[n][i] + rng.random()) / left) for n in names})
            else:
                add({n: _log_value(*coverage.ranges[n], rng.random()) for n in names})
    out = out[:want]
    if which == "coverage":
        for grid in filter(None, (coverage.grid, *coverage.more_grids)):
            for values in itertools.product(*grid.values()):
                add(dict(zip(grid, values)))
    return out


def sampled_traces(defn: dict, spec, which: str) -> tuple[list[dict], dict]:
    """(workload traces, {tensor key: tensor} for the set's blob) of one definition."""
    rng = random.Random(f"{which}/{defn['name']}")
    traces, blob = [], {}
    mixes = spec.coverage.mixes
    for i, axes in enumerate(sample_shapes(spec.coverage, which, rng)):
        if which != "coverage":
            chosen = [rng.choice(mixes)]
        elif (i >= spec.coverage.points and spec.coverage.grid_every_mix  # a grid shape: every mix,
              and not (spec.coverage.one_mix and spec.coverage.one_mix(axes))):
            chosen = [mixes[(i + k) % len(mixes)] for k in range(len(mixes))]  # its own one first
        else:
            chosen = [mixes[i % len(mixes)]]
        for mix in chosen:
            key = json.dumps(axes, sort_keys=True) + (f"/{mix}" if len(mixes) > 1 else "")
            uuid = str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"kdispatch/{which}/{defn['name']}/{key}"))
            traces.append(_trace(defn, axes, mixed_inputs(defn, spec, axes, mix, uuid, blob), uuid))
    return traces, blob


def mixed_inputs(defn: dict, spec, axes: dict, mix: str, uuid: str, blob: dict) -> dict:
    """A sampled workload's input specs; where the spec draws a length mix (prefill's cu_seqlens), the
    mix's tensors go into `blob` (seeded by the uuid) and the specs point at the set's blob file."""
    import torch

    from kdispatch.workloads import stable_seed

    inputs = input_specs(defn, spec.model_scalars)
    if spec.coverage.mix is not None:
        g = torch.Generator().manual_seed(stable_seed(uuid, 0, "mix"))
        for name, tensor in spec.coverage.mix(axes, mix, g).items():
            blob[f"{uuid}/{name}"] = tensor.contiguous()
            inputs[name] = {"type": "safetensors", "path": f"blob/{defn['op_type']}/{defn['name']}.safetensors",
                            "tensor_key": f"{uuid}/{name}"}
    return inputs


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

def _write_set(root: Path, defn: dict, source: Path, traces: list[dict], blob: dict, written: set) -> None:
    def_out = root / "definitions" / defn["op_type"] / f"{defn['name']}.json"
    def_out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, def_out)
    wl_out = root / "workloads" / defn["op_type"] / f"{defn['name']}.jsonl"
    wl_out.parent.mkdir(parents=True, exist_ok=True)
    wl_out.write_text("".join(json.dumps(t) + "\n" for t in traces))
    written |= {def_out, wl_out}
    if blob:
        from safetensors.torch import save_file

        blob_out = root / "blob" / defn["op_type"] / f"{defn['name']}.safetensors"
        blob_out.parent.mkdir(parents=True, exist_ok=True)
        save_file(dict(sorted(blob.items())), str(blob_out))
        written.add(blob_out)


def is_contest(defn: dict) -> bool:
    """A contest definition, or an engine convention (tagged `convention:...`: SGLang's and vLLM's
    call conventions, which have coverage and held-out sets only)."""
    return not any(t.startswith("convention:") for t in defn.get("tags", ()))


def build(axes_dir: Path, out_dir: Path = HERE) -> dict[str, dict[str, int]]:
    """Writes the datasets under out_dir; returns {set: {definition name: workload count}} with
    set "contest" for out_dir itself."""
    from kdispatch import definitions

    written: set[Path] = set()
    counts: dict[str, dict[str, int]] = {"contest": {}, **{s: {} for s in SAMPLED_SETS}}
    for name in definitions.names():
        defn, spec = definitions.load(name), definitions.get(name).spec
        csv_path = axes_dir / f"{name}.csv"
        if is_contest(defn):
            if not csv_path.is_file():
                raise FileNotFoundError(f"no contest axes for {name}: {csv_path}")
            traces = workload_traces(defn, csv_path, spec.model_scalars)
            _write_set(out_dir, defn, definitions.path(name), traces, {}, written)
            counts["contest"][name] = len(traces)
        if spec.coverage is None:
            continue
        for which in SAMPLED_SETS:
            traces, blob = sampled_traces(defn, spec, which)
            _write_set(out_dir / which, defn, definitions.path(name), traces, blob, written)
            counts[which][name] = len(traces)

    for root in (out_dir, *(out_dir / s for s in SAMPLED_SETS)):
        for pattern in DATASET_FILES:
            for p in root.glob(pattern):
                if p not in written:
                    p.unlink()
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--axes-dir", type=Path, default=DEFAULT_AXES_DIR,
                    help=f"folder of <definition>.csv files (default {DEFAULT_AXES_DIR})")
    ap.add_argument("--out", type=Path, default=HERE, help="dataset root (default: this folder)")
    args = ap.parse_args(argv)
    for which, counts in build(args.axes_dir, args.out).items():
        for name, n in counts.items():
            print(f"{n:4d}  {name}")
        where = args.out if which == "contest" else args.out / which
        print(f"{sum(counts.values()):4d}  {which} workloads in {where}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
