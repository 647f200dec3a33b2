#!/usr/bin/env bash
# Stages the serving engines' kernels for the GPU machine, which has no network, into
# .kd-wheels/engines/ (git-ignored, under 60 MiB): SGLang's wheel (pure Python; its Triton kernels
# are the baselines of the engine-convention GDN definitions and of moe_fp8, see
# kernels/library/{gdn,moe}/sglang.py and kernels/library/sglang_loader.py) and FlashMLA's
# (sgl-flash-mla, prebuilt sm_90a kernels on torch's stable ABI: kernels/library/dsa/flashmla.py;
# its metadata pins a newer torch, hence --no-deps and unpacking rather than pip install).
#
#   bash benchmarks/stage_engines.sh                       # here, once
#   run: carry [".kd-wheels/engines"], command bash .kd-wheels/engines/gpu-setup.sh   (first)
#   run: carry [".kd-wheels/engines-mla"], command bash .kd-wheels/engines-mla/gpu-setup.sh   (FlashMLA)
#   then benchmarks/rebundle.sh's b1 .. bN (shared/device's bundles re-packed to fit beside the tree),
#   then engines-deps and engines-vllm (below), each its own call, in the same hold of the machine
# gpu-setup.sh unpacks it under /tmp/kd-engines; benchmarks/gpu_env.sh puts /tmp/kd-engines on
# PYTHONPATH when it exists.
set -euo pipefail
SGLANG_SPEC=${SGLANG_SPEC:-sglang==0.5.23}
FLASHMLA_SPEC=${FLASHMLA_SPEC:-sgl-flash-mla==1.0.0}
out=.kd-wheels/engines
# Earlier versions moved c1's cuDNN-frontend wheel into this bundle (parts/); rebundle.sh now re-packs
# shared/device's bundles to fit beside the tree, so a wheel moved then goes back to c1 (re-run
# rebundle.sh after this script).
if ls "$out"/parts/*.whl >/dev/null 2>&1 && [ -d .kd-wheels/c1 ]; then mv "$out"/parts/*.whl .kd-wheels/c1/; fi
rm -rf "$out"
mkdir -p "$out"
pip download --no-deps --quiet -d "$out" "$SGLANG_SPEC" "$FLASHMLA_SPEC"
# Slimmed so a transfer (working tree + this folder) stays under 64 MiB: SGLang's Rust extensions,
# multimodal generation and tests are never loaded by the baselines (about 22 MB of 39).
python - "$out" <<'SLIM'
import pathlib, sys, zipfile
out = pathlib.Path(sys.argv[1])
(wheel,) = out.glob("sglang-*.whl")
dropped = ("sglang/srt/rust_extensions/", "sglang/multimodal_gen/", "sglang/test/")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out / (wheel.stem + ".slim.zip"), "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        if not item.filename.startswith(dropped):
            dst.writestr(item, src.read(item))
wheel.unlink()
SLIM
cat > "$out/gpu-setup.sh" <<'SETUP'
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p /tmp/kd-engines
shopt -s nullglob  # a bundle holds wheels, slimmed zips or both
for w in "$here"/*.whl "$here"/*.zip; do python -m zipfile -e "$w" /tmp/kd-engines; done
python - <<'CHECK'
import importlib.util, sys
sys.path.insert(0, "/tmp/kd-engines")
spec = importlib.util.find_spec("sglang")
print("kd-engines ready:", spec.submodule_search_locations[0] if spec else "sglang NOT FOUND")
try:
    import flash_mla
    print("flash_mla imports:", flash_mla.__file__)
except Exception as exc:
    print("flash_mla NOT usable:", type(exc).__name__, exc)
CHECK
SETUP
# FlashMLA travels in a call of its own (.kd-wheels/engines-mla, the same setup script, right after the
# engines bundle's): with the tree's results twins (40 MB on 2026-11-27) the two wheels together no
# longer fit one transfer
mla=.kd-wheels/engines-mla
rm -rf "$mla"
mkdir -p "$mla"
mv "$out"/sgl_flash_mla-*.whl "$mla"/
cp "$out/gpu-setup.sh" "$mla/"
du -sh "$out" "$mla"
echo "staged: carry .kd-wheels/engines, then .kd-wheels/engines-mla, each running its gpu-setup.sh on the GPU host"

# SGLang's own import-time needs, for importing its GDN kernel classes for real (benchmarks/sglang_layer.py;
# the baselines load its kernels bare and need none of these), as Python 3.12 wheels in a bundle of their
# own (the engines bundle and the tree leave no room): .kd-wheels/engines-deps, any call after the engines
# bundle's. Its gpu-setup.sh installs into /tmp/kd-engines-deps only the distributions the host lacks
# (PYTHONPATH comes before site-packages: nothing of the host's is shadowed).
deps=.kd-wheels/engines-deps
rm -rf "$deps"
mkdir -p "$deps"
platforms=()
for p in manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 \
         manylinux2014 manylinux_2_5 manylinux1; do platforms+=(--platform "${p}_x86_64"); done
pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d "$deps" Pygments aiohappyeyeballs aiohttp aiosignal anyio attrs certifi charset-normalizer einops frozenlist \
  idna ipython msgspec multidict orjson pillow propcache psutil pybase64 pyzmq requests starlette traitlets urllib3 yarl
cat > "$deps/gpu-setup.sh" <<'SETUP'
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
missing=()
for w in "$here"/*.whl; do
  dist=$(basename "$w" | cut -d- -f1)
  python -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$dist" 2>/dev/null || missing+=("$w")
done
if [ ${#missing[@]} -gt 0 ]; then
  python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/kd-engines-deps "${missing[@]}"
fi
echo "engines-deps: installed ${#missing[@]} distributions the host lacked into /tmp/kd-engines-deps"
SETUP
du -sh "$deps"

# vLLM's Python files (its wheel is 336 MB, nearly all compiled extensions no benchmark loads) and the
# one distribution its GDN kernels' imports need beyond the host's and engines-deps': .kd-wheels/engines-vllm,
# its own call after engines-deps' (whose pyzmq it needs). Its gpu-setup.sh unpacks them under /tmp/kd-vllm (benchmarks/gpu_env.sh:
# on PYTHONPATH when it exists) for benchmarks/vllm_kernels.py.
# 0.34.0: its FlashInfer prefill takes exp(g) and an output buffer (0.33.0, the release measured before
# 2026-12-02, takes the log decay: VLLM_SPEC=vllm==0.33.0 stages it)
VLLM_SPEC=${VLLM_SPEC:-vllm==0.34.0}
vl=.kd-wheels/engines-vllm
rm -rf "$vl"
mkdir -p "$vl"
tmp=$(mktemp -d)
pip download --no-deps --quiet -d "$tmp" "$VLLM_SPEC"
python - "$tmp" "$vl" <<'SLIM'
import pathlib, sys, zipfile
tmp, out = (pathlib.Path(a) for a in sys.argv[1:])
(wheel,) = tmp.glob("vllm-*.whl")
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out / (wheel.stem + ".py.zip"), "w", zipfile.ZIP_DEFLATED) as dst:
    for item in src.infolist():
        if item.filename.endswith(".py") or ".dist-info/" in item.filename:
            dst.writestr(item, src.read(item))
SLIM
rm -rf "$tmp"
pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" -d "$vl" regex
cat > "$vl/gpu-setup.sh" <<'SETUP'
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p /tmp/kd-vllm
python -m zipfile -e "$here"/vllm-*.py.zip /tmp/kd-vllm
python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/kd-vllm "$here"/regex-*.whl
# vLLM's CUDA platform imports its compiled op library (92 MB, not shipped) for its side effects only;
# the kernels benchmarked are Triton and need none of its ops
echo "# stand-in for the compiled op library (not staged: benchmarks/stage_engines.sh)" > /tmp/kd-vllm/vllm/_C_stable_libtorch.py
PYTHONPATH=/tmp/kd-vllm:/tmp/kd-engines-deps python -c "import vllm; from vllm.third_party.flash_linear_attention.ops import fused_recurrent_gated_delta_rule_packed_decode; print('kd-vllm ready:', vllm.__version__)"
SETUP
du -sh "$vl"

# shared/device's c2 and c3 bundles each hold half of one big wheel (part.aa, part.ab: 46 MB), which with
# this working tree (21 MB with the results twins, 2026-11-26) passes a transfer's 64 MiB. 3 MB of each
# move out: the head of part.aa into c1 (part.a0), the tail of part.ab into a bundle of its own, c4
# (part.ac, sent before c3: its call copies the file into the installer's staging folder), and the
# three installers join a0 + aa + ab + ac. Order: engines, c1, c2, c4, c3. Run once after shared/device's
# stage-wheels.sh (a second run finds part.a0 and leaves the bundles as they are).
MOVE=3000000
if [ -f .kd-wheels/c2/part.aa ] && [ ! -f .kd-wheels/c1/part.a0 ]; then
  chmod -R u+w .kd-wheels/c1 .kd-wheels/c2 .kd-wheels/c3
  head -c "$MOVE" .kd-wheels/c2/part.aa > .kd-wheels/c1/part.a0
  tail -c +"$((MOVE + 1))" .kd-wheels/c2/part.aa > .kd-wheels/c2/part.aa.rest
  mv .kd-wheels/c2/part.aa.rest .kd-wheels/c2/part.aa
  mkdir -p .kd-wheels/c4
  size=$(stat -c %s .kd-wheels/c3/part.ab)
  tail -c "$MOVE" .kd-wheels/c3/part.ab > .kd-wheels/c4/part.ac
  head -c "$((size - MOVE))" .kd-wheels/c3/part.ab > .kd-wheels/c3/part.ab.rest
  mv .kd-wheels/c3/part.ab.rest .kd-wheels/c3/part.ab
  for c in c1 c2 c3; do
    sed -i 's|if \[ ! -f "$parts/part.aa" \]|if [ ! -f "$parts/part.a0" ] \|\| [ ! -f "$parts/part.ac" ] \|\| [ ! -f "$parts/part.aa" ]|; s|cat "$parts/part.aa" "$parts/part.ab"|cat "$parts/part.a0" "$parts/part.aa" "$parts/part.ab" "$parts/part.ac"|' .kd-wheels/$c/gpu-setup.sh
  done
  echo "re-split the big wheel's parts; now run benchmarks/rebundle.sh (bundles that fit beside the tree)"
fi
