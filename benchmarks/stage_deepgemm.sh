#!/usr/bin/env bash
# Stages DeepGEMM for the GPU machine (offline; its published wheels do not load on the host's torch)
# into .kd-wheels/deepgemm/ (git-ignored): DeepGEMM's sources, fmt's headers and the CUTLASS / CuTe
# headers the sgl-deep-gemm wheel ships, as one archive, plus gpu-setup.sh, which builds the
# extension `deep_gemm._C` there against the host's torch (torch.utils.cpp_extension; the build is
# kept in /tmp/kd-deepgemm for the rest of the machine's hold) and checks that it imports and runs.
#
#   DG_REPO=<DeepGEMM checkout or bare git dir> FMT_REPO=<fmt checkout or git dir> \
#     bash benchmarks/stage_deepgemm.sh
#   run: carry [".kd-wheels/deepgemm"], command bash .kd-wheels/deepgemm/gpu-setup.sh (~50 s to build)
# benchmarks/gpu_env.sh then sources /tmp/kd-deepgemm/env.sh (`deep_gemm` on PYTHONPATH for
# kernels/library/dsa/deepgemm.py, the shared C++ runtime preloaded). DG_COMMIT / FMT_COMMIT pick the commits (default HEAD; the first staging used
# DeepGEMM 54e2261 = 2.6.1 and fmt 60ccad51). CUTLASS: DeepGEMM pins 4.2.1; the wheel's headers are
# 4.8.1 (SGLANG_DG_SPEC picks the wheel).
set -euo pipefail
DG_REPO=${DG_REPO:?set DG_REPO to a DeepGEMM git directory}
FMT_REPO=${FMT_REPO:?set FMT_REPO to an fmt git directory}
DG_COMMIT=${DG_COMMIT:-HEAD}
FMT_COMMIT=${FMT_COMMIT:-HEAD}
SGLANG_DG_SPEC=${SGLANG_DG_SPEC:-sgl-deep-gemm==0.2.5}
out=.kd-wheels/deepgemm
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$out"
mkdir -p "$out" "$work/src/third-party/cutlass/include" "$work/src/third-party/fmt" "$work/wheel"

git -C "$DG_REPO" archive "$DG_COMMIT" csrc deep_gemm setup.py LICENSE | tar -x -C "$work/src"
git -C "$FMT_REPO" archive "$FMT_COMMIT" include | tar -x -C "$work/src/third-party/fmt"
python "$(dirname "$0")/deepgemm_without_regex.py" "$work/src"  # its std::regex segfaulted on the GPU machine
pip download --no-deps --quiet -d "$work/wheel" "$SGLANG_DG_SPEC"
python -m zipfile -e "$work"/wheel/*.whl "$work/wheel/x"
for d in cutlass cute; do cp -r "$work/wheel/x/deep_gemm/include/$d" "$work/src/third-party/cutlass/include/"; done
{
  echo "DeepGEMM $(git -C "$DG_REPO" rev-parse "$DG_COMMIT")"
  echo "fmt $(git -C "$FMT_REPO" rev-parse "$FMT_COMMIT")"
  echo "CUTLASS/CuTe headers from $SGLANG_DG_SPEC"
  echo "std::regex replaced by string scans (benchmarks/deepgemm_without_regex.py)"
} > "$work/src/STAGED"
tar -C "$work" -cJf "$out/deepgemm-src.tar.xz" src

cat > "$out/gpu-setup.sh" <<'SETUP'
# Builds deep_gemm._C on the GPU machine against its torch (cached in /tmp/kd-deepgemm) and checks it.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=/tmp/kd-deepgemm
if [ ! -f "$root/src/deep_gemm/_C.so" ]; then
  rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf "$here/deepgemm-src.tar.xz"
  cat "$root/src/STAGED"
  for d in cutlass cute; do ln -sfn "$root/src/third-party/cutlass/include/$d" "$root/src/deep_gemm/include/$d"; done
  cuda=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
  for f in include/nvrtc.h include/cublasLt.h; do [ -e "$cuda/$f" ] || echo "note: $cuda/$f is missing"; done
  ( cd "$root/src" && CUDA_HOME=$cuda MAX_JOBS=16 timeout 400 python - <<'PY'
import os, shutil, time
from torch.utils.cpp_extension import load, CUDA_HOME as C
R = os.getcwd()
build = os.path.join(os.path.dirname(R), "build")
os.makedirs(build, exist_ok=True)
t0 = time.time()
m = load(name="_C", sources=[f"{R}/csrc/python_api.cpp"], with_cuda=True,
         extra_include_paths=[f"{C}/include", f"{C}/include/cccl", f"{R}/deep_gemm/include",
                              f"{R}/third-party/cutlass/include", f"{R}/third-party/fmt/include"],
         extra_cflags=["-O3", "-Wno-psabi", "-Wno-deprecated-declarations"],
         extra_ldflags=[f"-L{C}/lib64", "-lcudart", "-lnvrtc", "-lcublasLt"],
         build_directory=build, verbose=False)
shutil.copy(m.__file__, f"{R}/deep_gemm/_C.so")
print(f"deep_gemm._C built in {time.time() - t0:.0f} s")
PY
  ) 2>&1 | tail -30
fi
# What a process needs to use this build (benchmarks/gpu_env.sh sources it). The extension comes out
# with parts of the C++ runtime linked in statically (no libstdc++.so among its NEEDED) beside torch's
# exported copies: its first locale use (std::regex, then an ostream's number formatting in its JIT
# cache key) segfaulted in a half-bound facet (2026-11-27; gdb and a native backtrace placed it). With the
# shared runtime preloaded, every C++ runtime symbol binds to one copy and the JIT runs.
cat > "$root/env.sh" <<ENV
export PYTHONPATH="\${PYTHONPATH:+\$PYTHONPATH:}$root/src"
export CUDA_HOME=\${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
export LD_PRELOAD="$(g++ -print-file-name=libstdc++.so.6)\${LD_PRELOAD:+ \$LD_PRELOAD}"
ENV
# unbuffered, with the faulthandler: the first JIT call has segfaulted here (2026-11-25), which lost
# buffered output; the exit status below says so
cd "$root/src" && (. "$root/env.sh"; PYTHONUNBUFFERED=1 python -X faulthandler - <<'PY'
try:
    import deep_gemm, torch
    print("deep_gemm imports:", deep_gemm.__version__, "SMs", deep_gemm.get_num_sms())
    ctx = torch.tensor([[100]], dtype=torch.int32, device="cuda")
    meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, 64, deep_gemm.get_num_sms())
    torch.cuda.synchronize()
    print("deep_gemm JIT kernel runs: metadata", tuple(meta.shape))
except Exception as exc:
    print("deep_gemm NOT usable:", type(exc).__name__, str(exc)[:2000])
PY
)
status=$?
[ "$status" -eq 0 ] || echo "deep_gemm check exited with status $status (139: a segfault)"
SETUP
du -sh "$out"
echo "staged: carry .kd-wheels/deepgemm and run bash .kd-wheels/deepgemm/gpu-setup.sh on the GPU host"
