#!/usr/bin/env bash
# A kernel change against the tree before it, in one GPU-machine call: the same benchmark run over a copy of
# a committed tree and over the working tree, alternating (before, change, before, ...), its output kept.
# The copy holds the package and the kernels as committed and the working tree's benchmarks/, so a
# benchmark's new options reach both sides. On the development machine, from the project root:
#
#   bash benchmarks/tree_ab.sh stage [REF]     copy REF's tree (default HEAD) into .ab-before/ (git-ignored)
#   bash benchmarks/tree_ab.sh stage-alt       copy the working tree as it is into .ab-alt/ (git-ignored), to edit
#                                              there into an alternative of the change: a third arm
#   bash benchmarks/tree_ab.sh clean           remove both
#
# then on the GPU machine, with `carry` [".ab-before"] (a few MiB; [".ab-before", ".ab-alt"] for three arms):
#
#   bash benchmarks/tree_ab.sh run ROUNDS CMD  CMD (e.g. "python benchmarks/prefill_cp.py --shapes 1x8192")
#                                              over before, change[, alt], before, ... ROUNDS runs in all, each
#                                              run's output under a "## before" / "## change" / "## alt" line,
#                                              into $OUT/tree-ab.txt (TREE_AB_TIMEOUT seconds a run, default 120)
#
# benchmarks/tree_ab_summary.py puts the arms of prefill_cp.py runs side by side (medians over the runs).
#
# Without the GPU setup's bundles (benchmarks/gpu_env.sh) the package is found through PYTHONPATH alone: what
# needs FlashInfer or the engines' packages is then skipped by the benchmark, as it would be anywhere.
# benchmarks/results/cp-segments-ab-H200.txt and walk-lazy-decay-ab-H200.txt were taken this way (by hand).
set -euo pipefail
copy=.ab-before
alt=.ab-alt
# the package and kernels (a tree's tuner/*.py: REF's tracked ones), and the working tree's benchmarks/
copy_tree() {  # copy_tree REF|. DIR
  rm -rf "$2" && mkdir "$2"
  if [ "$1" = . ]; then
    cp -r kdispatch kernels routers "$2"/ && mkdir "$2"/tuner && cp tuner/*.py "$2"/tuner/
    find "$2"/kdispatch -maxdepth 1 -type l -delete  # gpu_env.sh's links, made again on the GPU machine
  else
    git archive "$1" kdispatch kernels routers $(git ls-tree --name-only "$1" tuner/ | grep '\.py$') | tar x -C "$2"
  fi
  cp -r benchmarks "$2"/benchmarks
  rm -rf "$2"/benchmarks/results
}
case "${1:?stage, stage-alt, run or clean}" in
  stage)
    ref=${2:-HEAD}
    copy_tree "$ref" "$copy"
    echo "$copy: $(git rev-parse --short "$ref") ($(du -sh "$copy" | cut -f1)); send it with carry [\"$copy\"]" ;;
  stage-alt)
    copy_tree . "$alt"
    echo "$alt: the working tree ($(du -sh "$alt" | cut -f1)); edit it, send it with carry [\"$copy\", \"$alt\"]" ;;
  run)
    rounds=${2:?rounds}
    cmd=${3:?command}
    [ -d "$copy" ] || { echo "tree_ab.sh: no $copy (stage it here, send it with carry)" >&2; exit 1; }
    if [ -f /tmp/kd-site/env.sh ]; then . benchmarks/gpu_env.sh; fi
    trees=("$copy" .)
    names=(before change)
    if [ -d "$alt" ]; then trees+=("$alt"); names+=(alt); fi
    for tree in "${trees[@]}"; do  # the package's mapped folders, as gpu_env.sh links them
      for d in kernels routers tuner; do [ -e "$tree/kdispatch/$d" ] || ln -s "../$d" "$tree/kdispatch/$d"; done
    done
    OUT=${OUT:-/tmp/kd-out}
    mkdir -p "$OUT"
    for ((i = 0; i < rounds; i++)); do
      tree=${trees[i % ${#trees[@]}]}
      name=${names[i % ${#trees[@]}]}
      echo "## $name" | tee -a "$OUT/tree-ab.txt"
      # shellcheck disable=SC2086  # the command is a list of words
      (cd "$tree" && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "${TREE_AB_TIMEOUT:-120}" $cmd) 2>&1 \
        | tee -a "$OUT/tree-ab.txt" || true
    done ;;
  clean)
    rm -rf "$copy" "$alt" ;;
  *)
    echo "tree_ab.sh: stage, stage-alt, run or clean" >&2; exit 2 ;;
esac
