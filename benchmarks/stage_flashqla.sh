#!/usr/bin/env bash
# Stages FlashQLA (TileLang GDN prefill kernels, kernels/library/gdn/flashqla.py) for the GPU machine,
# which has no network: flash-qla, tilelang and what they need beyond the host and the FlashInfer
# bundle, as Python 3.12 wheels in .kd-wheels/qla, then re-packed by rebundle.sh into bundles q1 .. qN
# that fit a transfer beside the tree (tilelang alone is 50 MB).
#
#   bash benchmarks/stage_flashqla.sh      # here, once (it runs rebundle.sh qla q)
#   run: carry [".kd-wheels/qK"], command bash .kd-wheels/qK/take.sh    (each, after the b bundles)
#
# The last take.sh installs them into /tmp/kd-qla, which benchmarks/gpu_env.sh puts on PYTHONPATH
# ahead of /tmp/kd-site. tilelang 0.1.15 needs apache-tvm-ffi < 0.1.13 (with the FlashInfer bundle's
# 0.1.15.post2 its import fails: "Type 'ffi.Tensor' already has a registered class"); FlashInfer
# 0.7.2 takes any 0.1.11 <= version < 0.2, so 0.1.12 from /tmp/kd-qla serves both in one process
# (both import on a CPU host that way, 2026-11-27). The setup then checks that FlashQLA runs.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=.kd-wheels/qla
rm -rf "$out"
mkdir -p "$out"
platforms=()
for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014; do platforms+=(--platform "${p}_x86_64"); done
pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$out" flash-qla==0.1.3 tilelang==0.1.15 apache-tvm-ffi==0.1.12 "z3-solver>=4.13.0,<4.15.5" \
  torch-c-dlpack-ext cloudpickle ml-dtypes
cat > "$out/gpu-setup.sh" <<'SETUP'
set -euo pipefail
parts=${KD_PARTS:?KD_PARTS: run through take.sh}
# only the distributions the host and /tmp/kd-site lack, and tvm-ffi always (the older one must win)
. /tmp/kd-site/env.sh
install=()
for w in "$parts"/*.whl; do
  dist=$(basename "$w" | cut -d- -f1)
  case "$dist" in apache_tvm_ffi) install+=("$w"); continue ;; esac
  python -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null || install+=("$w")
done
python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/kd-qla "${install[@]}"
# one small call (the contest prefill's heads, as the variants call it: TileLang compiles its kernels
# here, cached on disk for the tune): only then may benchmarks/gpu_env.sh put /tmp/kd-qla on the path,
# so that a setup that failed leaves the FlashQLA variants missing rather than failing every workload
PYTHONPATH=/tmp/kd-qla:$PYTHONPATH python -c "
import torch, tvm_ffi, flashinfer, tilelang, flash_qla
from flash_qla import chunk_gated_delta_rule
T, N, H, HV = 200, 2, 4, 8
dev = torch.device('cuda')
q, k = (torch.nn.functional.normalize(torch.randn(1, T, H, 128, device=dev), dim=-1).bfloat16() for _ in range(2))
v = torch.randn(1, T, HV, 128, device=dev).bfloat16()
g = -torch.rand(1, T, HV, device=dev) * 0.1
beta = torch.rand(1, T, HV, device=dev)
h0 = torch.randn(N, HV, 128, 128, device=dev)
cu = torch.tensor([0, 73, T], dtype=torch.int64, device=dev)
o, ht = chunk_gated_delta_rule(q, k, v, g, beta, scale=128 ** -0.5, initial_state=h0, output_final_state=True,
                               cu_seqlens=cu, state_v_first=True)
assert torch.isfinite(o.float()).all() and torch.isfinite(ht).all(), 'FlashQLA returned non-finite values'
print('kd-qla ready: flash_qla', flash_qla.__version__, 'tilelang', tilelang.__version__,
      'tvm_ffi', tvm_ffi.__version__, 'flashinfer', flashinfer.__version__)" && touch /tmp/kd-qla/.ready
SETUP
du -sh "$out"
bash benchmarks/rebundle.sh qla q
