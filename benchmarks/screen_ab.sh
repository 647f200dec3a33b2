#!/usr/bin/env bash
# The tune's screen, measured: one arm of an A/B that tunes the same workloads from an empty store with
# `--screen FACTOR` (0: every pair gated and timed in full). Run two arms side by side, one GPU each
# (benchmarks/on_gpus.sh), then compare their wall times and benchmarks/tune_time.py's split:
#
#   bash benchmarks/on_gpus.sh "bash benchmarks/screen_ab.sh 0" "bash benchmarks/screen_ab.sh 2"
#
# AB_DEFINITION (default gdn_prefill_pool_qk4_v8_d128_k_last) picks the coverage set's file, AB_SEQS
# (default "32 64") the sequence counts kept from it; the store comes back as $OUT/screen-ab-FACTOR.sqlite.
set -euo pipefail
factor=${1:?screen factor}
definition=${AB_DEFINITION:-gdn_prefill_pool_qk4_v8_d128_k_last}
OUT=${OUT:-/tmp/kd-out}
set_dir=/tmp/screen-ab-$factor
store=$OUT/screen-ab-$factor.sqlite
rm -rf "$set_dir" "$store"
python - "$definition" "$set_dir" ${AB_SEQS:-32 64} <<'PY'
import json, pathlib, shutil, sys

definition, dst, seqs = sys.argv[1], pathlib.Path(sys.argv[2]), {int(s) for s in sys.argv[3:]}
src = pathlib.Path("traces/coverage")
for sub in ("definitions", "blob"):  # blob: the long mixes' cu_seqlens are stored tensors
    shutil.copytree(src / sub, dst / sub)
(path,) = src.glob(f"workloads/*/{definition}.jsonl")
kept = [line for line in path.read_text().splitlines() if json.loads(line)["workload"]["axes"]["num_seqs"] in seqs]
out = dst / path.relative_to(src)
out.parent.mkdir(parents=True)
out.write_text("\n".join(kept) + "\n")
print(f"{len(kept)} workloads of {definition} with {sorted(seqs)} sequences")
PY
start=$(date +%s)
python -m kdispatch.cli tune --workloads "$set_dir" --store "$store" --no-route --screen "$factor" 2>&1 | tail -4
echo "screen $factor: tune wall time $(( $(date +%s) - start )) s"
python benchmarks/tune_time.py --store "$store" --workloads "$set_dir" 2>&1 | tail -12
