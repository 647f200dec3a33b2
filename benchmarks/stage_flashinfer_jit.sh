#!/usr/bin/env bash
# Stages what FlashInfer's nvcc JIT needs on the GPU machine, which the c/b bundles leave out
# (../shared/device/stage-wheels.sh drops flashinfer/data: 330 MB of CUDA sources): the top-level
# csrc files (not its subfolders, the per-model kernels), the headers (include, cccl, CUTLASS's
# include trees without its examples and tests, spdlog) and a ninja wheel, about 13 MB zipped, in
# .kd-wheels/fi-jit. With them FlashInfer builds, on its first call, the kernels issue 16 wants as
# Hopper baselines: `top_k_page_table_transform` (the DSA indexer's top-k; module "topk") and the
# FA3 MLA wrapper.
#
#   bash benchmarks/stage_flashinfer_jit.sh     # here, once
#   run: carry [".kd-wheels/fi-jit"], command bash .kd-wheels/fi-jit/gpu-setup.sh   (after the b bundles)
#
# The setup unpacks the files into the kd-site FlashInfer package, puts ninja on the path where the
# host lacks it (benchmarks/gpu_env.sh adds /tmp/kd-site/bin), then builds the top-k module: 8.5 min
# on an H100 host (2026-11-27) with nvcc's -split-compile over the host's cores (cub_topk.cu alone
# outlasts a 9-minute call without it). It installs the module as FlashInfer's prebuilt (AOT) one, so
# that no later call of the hold builds again (its JIT cache would, whenever the flags differ), and
# leaves it in $OUT compressed (~10 MB), for the one-call path of later machines:
#
#   bash benchmarks/stage_flashinfer_jit.sh --prebuilt PATH/flashinfer-topk-sm90a.so.xz   # here
#   run: carry [".kd-wheels/fi-aot"], command bash .kd-wheels/fi-aot/gpu-setup.sh      (after the b bundles)
#
# Both setups end with benchmarks/flashinfer_topk_check.py (one call against torch.topk).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
# where FlashInfer looks for a prebuilt module (both setups install one there)
install_aot='
aot=$(python -c "from flashinfer.jit import env; print(env.FLASHINFER_AOT_DIR)")/topk
mkdir -p "$aot"'
if [ "${1:-}" = --prebuilt ]; then
  out=.kd-wheels/fi-aot
  rm -rf "$out"
  mkdir -p "$out"
  cp "${2:?the flashinfer-topk-sm90a.so.xz a fi-jit setup left in \$OUT}" "$out/flashinfer-topk-sm90a.so.xz"
  cat > "$out/gpu-setup.sh" <<SETUP
set -euo pipefail
here=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
. /tmp/kd-site/env.sh
$install_aot
xz -dc "\$here/flashinfer-topk-sm90a.so.xz" > "\$aot/topk.so"
python benchmarks/flashinfer_topk_check.py
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
# the build: nvcc splits each file's compilation over the host's cores
FLASHINFER_EXTRA_CUDAFLAGS="-split-compile=0" python benchmarks/flashinfer_topk_check.py
$install_aot
cp "\$(python -c "from flashinfer.jit.topk import gen_topk_module; print(gen_topk_module().jit_library_path)")" "\$aot/topk.so"
if [ -n "\${OUT:-}" ]; then xz -T0 -c "\$aot/topk.so" > "\$OUT/flashinfer-topk-sm90a.so.xz"; fi
SETUP
du -sh "$out"
