#!/usr/bin/env bash
# The tune's warm-up, measured: one arm of an A/B that tunes the same definitions from an empty store and
# empty compile caches (Triton's, the NVRTC cubins') with `--warm N` (0: no warm-up, every first call
# compiles in the measuring worker). Run two arms side by side, one GPU each (benchmarks/on_gpus.sh), then
# compare their wall times and pairs measured:
#
#   bash benchmarks/on_gpus.sh "bash benchmarks/warm_ab.sh 0" "bash benchmarks/warm_ab.sh 8"
#
# AB_DEFINITIONS (default: the decode and verify definitions of qk4_v8 and the contest decode) picks the
# definitions, AB_MINUTES (default 6.5) the tune's --max-minutes; the store comes back as
# $OUT/warm-ab-N.sqlite, the log's tail as the arm's output.
set -euo pipefail
warm=${1:?warm-up workers per GPU}
OUT=${OUT:-/tmp/kd-out}
dir=/tmp/warm-ab-$warm
store=$OUT/warm-ab-$warm.sqlite
rm -rf "$dir" "$store"
mkdir -p "$dir"
export TRITON_CACHE_DIR=$dir/triton KDISPATCH_CACHE=$dir/kdispatch
start=$(date +%s)
# shellcheck disable=SC2086  # a list of names
python -m kdispatch.cli tune --store "$store" --no-route --warm "$warm" --max-minutes "${AB_MINUTES:-6.5}" \
  --definitions ${AB_DEFINITIONS:-gdn_decode gdn_decode_packed_qk4_v8 gdn_verify_qk4_v8 gdn_verify_steps_qk4_v8} \
  > "$dir/tune.log" 2>&1 || echo "tune exit $?"
grep -E "^\[warm\] [0-9]+ first|^\[warm\] [0-9]+:|time budget|measured|^tuned" "$dir/tune.log" | tail -6
grep -E "^\[warm\] \[" "$dir/tune.log" | tail -1 | cut -c1-160
echo "warm $warm: tune wall time $(( $(date +%s) - start )) s"
