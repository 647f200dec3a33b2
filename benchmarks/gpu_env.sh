# Source on the GPU machine (after shared/device's gpu-setup.sh): puts kdispatch on the path even when
# the offline image cannot `pip install -e .`, by linking the mapped folders into the package.
. /tmp/kd-site/env.sh
# FlashQLA (benchmarks/stage_flashqla.sh; .ready once its setup ran it) ahead of kd-site: its
# apache-tvm-ffi 0.1.12 must shadow the FlashInfer bundle's 0.1.15.post2, which tilelang cannot load with
if [ -f /tmp/kd-qla/.ready ]; then export PYTHONPATH="/tmp/kd-qla:$PYTHONPATH"; fi
# -P: the check must not find the package through the current folder, which scripts under benchmarks/ do not see
if ! python -P -c "import kdispatch.kernels, kdispatch.tuner, kdispatch.routers" 2>/dev/null; then
  for d in kernels routers tuner; do [ -e kdispatch/$d ] || ln -s ../$d kdispatch/$d; done
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
# ninja for FlashInfer's nvcc JIT, where benchmarks/stage_flashinfer_jit.sh's setup installed it
if [ -x /tmp/kd-site/bin/ninja ]; then export PATH="/tmp/kd-site/bin:$PATH"; fi
# serving engines' packages staged by benchmarks/stage_engines.sh (SGLang's kernels)
if [ -d /tmp/kd-engines ]; then export PYTHONPATH="$PYTHONPATH:/tmp/kd-engines"; fi
# SGLang's import-time needs the host lacks (stage_engines.sh's engines-deps bundle: benchmarks/sglang_layer.py)
if [ -d /tmp/kd-engines-deps ]; then export PYTHONPATH="$PYTHONPATH:/tmp/kd-engines-deps"; fi
# vLLM's Python files and their one extra need (stage_engines.sh's engines-vllm bundle: benchmarks/vllm_kernels.py)
if [ -d /tmp/kd-vllm ]; then export PYTHONPATH="$PYTHONPATH:/tmp/kd-vllm"; fi
# DeepGEMM built by benchmarks/stage_deepgemm.sh's gpu-setup.sh: its path, CUDA_HOME for its JIT's nvcc,
# the C++ runtime it needs preloaded
if [ -f /tmp/kd-deepgemm/env.sh ]; then . /tmp/kd-deepgemm/env.sh; fi
