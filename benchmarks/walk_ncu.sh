#!/usr/bin/env bash
# Nsight Compute over the staged prefill (cuda_prefill_staged.r64s4): by default its walk
# (kernels/cuda/gdn/prefill_walk.cu) at two pool-prefill shapes where the pool prefills fall short of
# issue 18's 2x; KERNEL=<regex> profiles another of its launches (KERNEL=gdn_prefill_algebra_pool: the
# first launch of the pool and gathered prefills; gdn_prefill_algebra_contest: the contest's), and
# "definition axes" argument pairs replace the shapes. Speed of light, compute
# and memory workload, scheduler and warp states (with where the stalls sample, SourceCounters),
# instruction counts, occupancy (which resource caps the resident blocks). On the GPU machine, from the
# project root, after `. benchmarks/gpu_env.sh`:
#
#   bash benchmarks/walk_ncu.sh > walk-ncu-H200.txt
#   KERNEL=gdn_prefill_algebra_pool bash benchmarks/walk_ncu.sh gdn_prefill_pool_qk16_v32 total_seq_len=512,num_seqs=4,num_slots=5
#
# Each shape runs in its own process: the variant twice (the first compiles), the second launch profiled.
set -u
call=$(mktemp --suffix .py)
trap 'rm -f "$call"' EXIT
cat > "$call" <<'P'
import sys

import torch

from kdispatch import definitions, registry
from kdispatch.workloads import SimpleWorkload, materialize

registry.discover()
definition = definitions.resolve_name(sys.argv[1])
axes = {k: int(v) for k, v in (kv.split("=") for kv in sys.argv[2].split(","))}
args = list(materialize(definition, SimpleWorkload(axes, uuid="walk-ncu"), device="cuda", seed=0))
fn = registry.get(definition, "cuda_prefill_staged.r64s4").fn
for _ in range(2):
    fn(*args)
torch.cuda.synchronize()
P
kernel=${KERNEL:-gdn_prefill_walk}
if [ $# -eq 0 ]; then
  set -- gdn_prefill_pool_qk16_v32 total_seq_len=2048,num_seqs=8,num_slots=9 \
         gdn_prefill_pool_qk4_v8 total_seq_len=2048,num_seqs=32,num_slots=33
fi
while [ $# -ge 2 ]; do
  echo "### ncu --clock-control none --kernel-name regex:$kernel --launch-skip 1 --launch-count 1 (cuda_prefill_staged.r64s4, $1 $2)"
  ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters \
    python "$call" "$1" "$2" 2>&1 | grep -v "^==PROF==\|Warning\|_warn_once"
  shift 2
done
