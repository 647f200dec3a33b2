#!/usr/bin/env bash
# The MoE Triton (and DeepGEMM glue) modules of an earlier revision as a folder benchmarks/moe_host_ab.py
# imports beside the working tree's (the GPU machine has no git): run on the dev box, then send the folder
# with the tree (it is not ignored) and run `python benchmarks/moe_host_ab.py --old DIR`. Registrations
# are cut (the registry holds the working tree's) and launch keys renamed (two kernels of one name under
# one key are refused). Remove DIR before committing.
#
#   bash benchmarks/moe_ab_old.sh REV [DIR]     (DIR defaults to moe-old)
set -eu
rev=${1:?revision}
dir=${2:-moe-old}
rm -rf "$dir" && mkdir -p "$dir"
git show "$rev:kernels/triton/moe/fp8_grouped.py" | sed '/^def _register/,$d' > "$dir/old_grouped.py"
git show "$rev:kernels/triton/moe/fp8_decode.py" | sed '/^@variant(/,$d' \
    | sed 's/from kdispatch.kernels.triton.moe.fp8_grouped import/from old_grouped import/' > "$dir/old_decode.py"
git show "$rev:kernels/library/moe/deepgemm_fused.py" | sed '/^@variant(/,$d' \
    | sed 's/from kdispatch.kernels.triton.moe.fp8_grouped import/from old_grouped import/' > "$dir/old_deepgemm_fused.py"
sed -i 's/call_key("moe_fp8 /call_key("old moe_fp8 /' "$dir"/old_*.py
grep -q 'call_key("old moe_fp8 ' "$dir/old_decode.py" || { echo "moe_ab_old.sh: no launch key renamed in $dir" >&2; exit 1; }
echo "$dir: $(git rev-parse --short "$rev")'s old_grouped.py, old_decode.py, old_deepgemm_fused.py"
