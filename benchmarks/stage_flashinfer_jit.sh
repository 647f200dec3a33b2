#!/usr/bin/env bash
# Stages what FlashInfer's nvcc JIT needs on the GPU machine, which the c/b bundles leave out
# (../shared/device/stage-wheels.sh drops flashinfer/data: 330 MB of CUDA sources): the top-level
# csrc files (not its subfolders, the per-model kernels), the headers (include, cccl, CUTLASS's
# include trees without its examples and tests, spdlog) and a ninja wheel, about 13 MB zipped, in
# .kd-wheels/fi-jit. With them FlashInfer builds, on its first call, the modules issue 16 wants as
# Hopper baselines and peers: "topk" (`top_k_page_table_transform`, the DSA indexer's top-k) and the
# FA3 MLA module (`BatchMLAPagedAttentionWrapper`, the sparse-attention peer
# kernels/library/dsa/flashinfer_fa3.py).
#
#   bash benchmarks/stage_flashinfer_jit.sh     # here, once
#   run: carry [".kd-wheels/fi-jit"], command FI_MODULE=topk|fa3 bash .kd-wheels/fi-jit/gpu-setup.sh
#        (after the b bundles; topk by default)
#
# The setup unpacks the files into the kd-site FlashInfer package, puts ninja on the path where the
# host lacks it (benchmarks/gpu_env.sh adds /tmp/kd-site/bin), then builds the module through its
# check (benchmarks/flashinfer_<module>_check.py): topk took 8.5 min on an H100 host (2026-11-27)
# with nvcc's -split-compile over the host's cores (cub_topk.cu alone outlasts a 9-minute call
# without it). It installs the module as FlashInfer's prebuilt (AOT) one, so that no later call of
# the hold builds again (its JIT cache would, whenever the flags differ), and leaves it in $OUT
# compressed (flashinfer-<module>-sm90a.so.xz, ~10 MB for topk), for the one-call path of later
# machines:
#
#   bash benchmarks/stage_flashinfer_jit.sh --prebuilt PATH/flashinfer-topk-sm90a.so.xz [...-fa3-...]   # here
#   run: carry [".kd-wheels/fi-aot"], command bash .kd-wheels/fi-aot/gpu-setup.sh      (after the b bundles)
#
# Both modules, built on an H200 host on 2026-11-28 (torch 2.11, CUDA 13), are kept on the branches
# artifacts/flashinfer-topk-sm90a and artifacts/flashinfer-fa3-sm90a, one file each, named as --prebuilt
# wants them (`git show artifacts/flashinfer-fa3-sm90a:flashinfer-fa3-sm90a.so.xz > /tmp/flashinfer-fa3-sm90a.so.xz`).
#
# FlashInfer renders the FA3 MLA module's sources whenever it loads it, prebuilt or not: with that
# module, fi-aot also takes those csrc files from .kd-wheels/fi-jit (stage it first). Both setups end
# with each module's check.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# a module's FlashInfer name, from its short one (topk, fa3): its JIT cache folder and prebuilt file
# are named after it; then where FlashInfer looks for it prebuilt
module_name='
module_name() {
  case "$1" in
    topk) echo topk ;;
    fa3) python -c "import sys; sys.path.insert(0, \".\"); from kdispatch.kernels.library.dsa.flashinfer_fa3 import fa3_module_name; print(fa3_module_name())" ;;
    *) echo "unknown FlashInfer module $1 (topk, fa3)" >&2; return 1 ;;
  esac
}
aot_so() { python -c "from flashinfer.jit import env; print(env.FLASHINFER_AOT_DIR / \"$1\" / \"$1.so\")"; }'
FA3_SOURCES="batch_mla_config.jinja batch_mla_sm90_plan.cu batch_mla_sm90_run.cu batch_mla_sm90_binding.cu"
if [ "${1:-}" = --prebuilt ]; then
  shift
  [ $# -gt 0 ] || { echo "--prebuilt wants the flashinfer-<module>-sm90a.so.xz files a fi-jit setup left in \$OUT" >&2; exit 2; }
  out=.kd-wheels/fi-aot
  rm -rf "$out"
  mkdir -p "$out"
  for f in "$@"; do
    cp "$f" "$out/"
    case "$(basename "$f")" in flashinfer-fa3-sm90a.so.xz)
      zip=.kd-wheels/fi-jit/flashinfer-data.zip
      [ -f "$zip" ] || { echo "$zip missing: run bash benchmarks/stage_flashinfer_jit.sh first" >&2; exit 2; }
      python - "$zip" "$out/fa3-sources.zip" $FA3_SOURCES <<'PY'
import sys, zipfile
src, dst, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as o:
    for n in names:
        o.writestr(f"flashinfer/data/csrc/{n}", z.read(f"flashinfer/data/csrc/{n}"))
PY
    esac
  done
  cat > "$out/gpu-setup.sh" <<SETUP
set -euo pipefail
here=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
# the project's path too (the fa3 module's name comes from kdispatch.kernels), not only the packages':
# with /tmp/kd-site/env.sh alone the name lookup failed and, the script stopping there, FlashInfer's
# top-k module was never installed (2026-11-28)
. benchmarks/gpu_env.sh
$module_name
if [ -f "\$here/fa3-sources.zip" ]; then
  site=\$(python -c "import importlib.util, os; print(os.path.dirname(os.path.dirname(importlib.util.find_spec('flashinfer').origin)))")
  python -m zipfile -e "\$here/fa3-sources.zip" "\$site"
fi
for f in "\$here"/flashinfer-*-sm90a.so.xz; do
  short=\$(basename "\$f" -sm90a.so.xz); short=\${short#flashinfer-}
  so=\$(aot_so "\$(module_name "\$short")")
  mkdir -p "\$(dirname "\$so")"
  xz -dc "\$f" > "\$so"
  python benchmarks/flashinfer_\${short}_check.py
done
SETUP
  du -sh "$out"
  exit 0
fi
out=.kd-wheels/fi-jit
rm -rf "$out"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
platforms=()
for p in manylinux_2_34 manylinux_2_28 manylinux_2_17 manylinux2014; do platforms+=(--platform "${p}_x86_64"); done
pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$tmp" flashinfer-python==0.7.2.post1 ninja
python - "$tmp" "$out" <<'PY'
import glob, os, sys, zipfile

src, out = sys.argv[1:]
(whl,) = glob.glob(os.path.join(src, "flashinfer_python-*.whl"))
trees = ("flashinfer/data/include/", "flashinfer/data/cccl/", "flashinfer/data/cutlass/include/",
         "flashinfer/data/cutlass/tools/util/include/", "flashinfer/data/spdlog/include/")
n = 0
with zipfile.ZipFile(whl) as z, zipfile.ZipFile(os.path.join(out, "flashinfer-data.zip"), "w",
                                                zipfile.ZIP_DEFLATED) as o:
    for info in z.infolist():
        name = info.filename
        top_csrc = name.startswith("flashinfer/data/csrc/") and name.count("/") == 3
        if top_csrc or name.startswith(trees):
            o.writestr(info, z.read(info))
            n += 1
print(f"flashinfer-data.zip: {n} files")
PY
cp "$tmp"/ninja-*.whl "$out"/
cat > "$out/gpu-setup.sh" <<SETUP
set -euo pipefail
here=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
. /tmp/kd-site/env.sh
site=\$(python -c "import importlib.util, os; print(os.path.dirname(os.path.dirname(importlib.util.find_spec('flashinfer').origin)))")
python -m zipfile -e "\$here/flashinfer-data.zip" "\$site"   # paths start with flashinfer/data/
if ! command -v ninja >/dev/null; then
  python -m pip install -q --no-index --no-deps --no-compile --target /tmp/kd-site "\$here"/ninja-*.whl
  export PATH="/tmp/kd-site/bin:\$PATH"
fi
echo "ninja \$(ninja --version)"
$module_name
short=\${FI_MODULE:-topk}
name=\$(module_name "\$short")
# the build, by the module's first call: nvcc splits each file's compilation over the host's cores
FLASHINFER_EXTRA_CUDAFLAGS="-split-compile=0" python benchmarks/flashinfer_\${short}_check.py
so=\$(aot_so "\$name")
mkdir -p "\$(dirname "\$so")"
cp "\$(python -c "from flashinfer.jit import env; print(env.FLASHINFER_JIT_DIR / \"\$name\" / \"\$name.so\")")" "\$so"
if [ -n "\${OUT:-}" ]; then xz -T0 -c "\$so" > "\$OUT/flashinfer-\$short-sm90a.so.xz"; fi
SETUP
du -sh "$out"
