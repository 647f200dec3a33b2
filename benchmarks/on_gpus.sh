#!/usr/bin/env bash
# Runs several GPU steps at once, each on its own GPU of this host, in one GPU-machine call: the lent
# multi-GPU machines count device time per machine, not per GPU (2026-11-28), so benches and held-out
# runs that each need one GPU cost a quarter as much on four. From the project root, after the setup:
#
#   bash benchmarks/on_gpus.sh "TUNE_TAG=-a BENCH_ARGS='--definitions X' bash benchmarks/retune.sh check 4" \
#                              "TUNE_TAG=-b BENCH_ARGS='--definitions Y' bash benchmarks/retune.sh check 4"
#
# Argument i runs with CUDA_VISIBLE_DEVICES=i (a distinct TUNE_TAG each keeps their archives apart), its
# output in $OUT/gpu<i>.log; waits for all, prints each log's tail, and exits non-zero if any step did.
# (`kdispatch tune --device cuda` spreads one tune over every GPU by itself.) KD_GPUS overrides the
# GPU count nvidia-smi reports.
set -u
OUT=${OUT:-/tmp/kd-out}
mkdir -p "$OUT"
gpus=${KD_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
[ "$#" -ge 1 ] || { echo "on_gpus.sh: give one command per GPU" >&2; exit 2; }
[ "$#" -le "$gpus" ] || { echo "on_gpus.sh: $# commands for $gpus GPU(s)" >&2; exit 2; }
pids=()
i=0
for cmd in "$@"; do
  CUDA_VISIBLE_DEVICES=$i OUT=$OUT bash -c "$cmd" > "$OUT/gpu$i.log" 2>&1 &
  pids+=("$!")
  i=$((i + 1))
done
rc=0
codes=()
for p in "${pids[@]}"; do
  wait "$p"
  c=$?
  codes+=("$c")
  [ "$c" -eq 0 ] || rc=1
done
for j in "${!codes[@]}"; do
  echo "== GPU $j, exit ${codes[$j]}: ${*:$((j + 1)):1}"
  tail -n "${KD_TAIL:-15}" "$OUT/gpu$j.log"
done
exit "$rc"
