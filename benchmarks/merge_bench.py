"""Merges a `kdispatch bench --json` file that covers some definitions into a full one of the same
environment: the part's definitions replace theirs (rows and summary), every other definition stays.
A bench split over several GPU-machine calls (`retune.sh check` / `contest` with --definitions and
TUNE_TAG) is put back together this way.

    python benchmarks/merge_bench.py FULL.json PART.json [PART.json ...]    # FULL.json rewritten
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def merge(full: dict, part: dict) -> dict:
    if full["env"] != part["env"]:
        raise SystemExit("merge_bench: the two files come from different environments")
    if not part.get("complete", True):
        raise SystemExit("merge_bench: the part stopped before measuring everything (complete: false)")
    defs = set(part["summary"])
    full["results"] = [r for r in full["results"] if r["definition"] not in defs] + part["results"]
    full["summary"].update(part["summary"])
    return full


def main(argv=None) -> int:
    paths = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if len(paths) < 2:
        raise SystemExit("usage: merge_bench.py FULL.json PART.json [PART.json ...]")
    full_path, parts = paths[0], paths[1:]
    merged = json.loads(full_path.read_text())
    for part_path in parts:  # each part checked and merged before anything is written
        merged = merge(merged, json.loads(part_path.read_text()))
    full_path.write_text(json.dumps(merged, indent=1))
    print(f"merged {', '.join(p.name for p in parts)} into {full_path.name}: {len(merged['results'])} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
