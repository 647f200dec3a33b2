#!/usr/bin/env bash
# A kernel change against the tree before it, in one GPU-machine call: the same benchmark run over a copy of
# a committed tree and over the working tree, alternating (before, change, before, ...), its output kept.
# The copy holds the package and the kernels as committed and the working tree's benchmarks/, so a
# benchmark's new options reach both sides. On the development machine, from the project root:
#
#   bash benchmarks/tree_ab.sh stage [REF]     copy REF's tree (default HEAD) into .ab-before/ (git-ignored)
#   bash benchmarks/tree_ab.sh clean           remove it
#
# then on the GPU machine, with `carry` [".ab-before"] (a few MiB):
#
#   bash benchmarks/tree_ab.sh run ROUNDS CMD  CMD (e.g. "python benchmarks/prefill_cp.py --shapes 1x8192")
#                                              over before, change, before, ... ROUNDS runs in all, each run's
#                                              output under a "## before" / "## change" line, into
#                                              $OUT/tree-ab.txt (TREE_AB_TIMEOUT seconds a run, default 120)
#
# Without the GPU setup's bundles (benchmarks/gpu_env.sh) the package is found through PYTHONPATH alone: what
# needs FlashInfer or the engines' packages is then skipped by the benchmark, as it would be anywhere.
# benchmarks/results/cp-segments-ab-H200.txt and walk-lazy-decay-ab-H200.txt were taken this way (by hand).
set -euo pipefail
copy=.ab-before
case "${1:?stage, run or clean}" in
  stage)
    ref=${2:-HEAD}
    rm -rf "$copy" && mkdir "$copy"
    git archive "$ref" kdispatch kernels routers $(git ls-tree --name-only "$ref" tuner/ | grep '\.py$') | tar x -C "$copy"
    cp -r benchmarks "$copy"/benchmarks
    rm -rf "$copy"/benchmarks/results
    echo "$copy: $(git rev-parse --short "$ref") ($(du -sh "$copy" | cut -f1)); send it with carry [\"$copy\"]" ;;
  run)
    rounds=${2:?rounds}
    cmd=${3:?command}
    [ -d "$copy" ] || { echo "tree_ab.sh: no $copy (stage it here, send it with carry)" >&2; exit 1; }
    if [ -f /tmp/kd-site/env.sh ]; then . benchmarks/gpu_env.sh; fi
    for tree in . "$copy"; do  # the package's mapped folders, as gpu_env.sh links them
      for d in kernels routers tuner; do [ -e "$tree/kdispatch/$d" ] || ln -s "../$d" "$tree/kdispatch/$d"; done
    done
    OUT=${OUT:-/tmp/kd-out}
    mkdir -p "$OUT"
    for ((i = 0; i < rounds; i++)); do
      if ((i % 2)); then tree=.; name=change; else tree=$copy; name=before; fi
      echo "## $name" | tee -a "$OUT/tree-ab.txt"
      # shellcheck disable=SC2086  # the command is a list of words
      (cd "$tree" && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "${TREE_AB_TIMEOUT:-120}" $cmd) 2>&1 \
        | tee -a "$OUT/tree-ab.txt" || true
    done ;;
  clean)
    rm -rf "$copy" ;;
  *)
    echo "tree_ab.sh: stage, run or clean" >&2; exit 2 ;;
esac
