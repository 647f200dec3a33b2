"""SGLang's own GDN decode kernel, the baseline of the engine-convention definitions
(gdn_decode_packed_*) on Hopper: SGLang decodes Qwen3-Next there with its Triton packed decode
(`fused_recurrent_gated_delta_rule_packed_decode`, q/k/v packed, L2 norm and gates in the kernel,
the state pool updated in place through slot indices), called as its GDN backend calls it. vLLM's
default decode kernel has the same contract.

Loading: SGLang's package `__init__` starts its whole server stack (zmq, orjson, starlette, ...),
which a kernel benchmark does not have and does not need. Where `sglang` is not imported yet, the
packages above the kernel's folder are registered as bare packages over their folders (their
`__init__` files do not run) and the one name the kernel's helpers take from
`sglang.srt.utils.common`, `torch_release`, is provided. In a process that imported SGLang itself
(inside the engine) the real modules are used as they are. Stage the wheel for the GPU machine
with `benchmarks/stage_engines.sh`.

Safety: SGLang's kernel treats a negative slot as padding but trusts the others; the wrapper sends
slots past the pool's end to -1 first (kernels/cuda/gdn/slot_guard.py, one launch), so no index
reads or writes outside it.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path

import torch

from kdispatch.definitions.gdn.spec import PACKED_HEADS, packed_name
from kdispatch.kernels.cuda.gdn import slot_guard
from kdispatch.registry import variant

KERNEL_MODULE = "sglang.kernels.ops.attention.fla.fused_recurrent"
_kernel = None


def _bare_packages(module: str) -> None:
    """Registers every package above `module` that is not imported yet as a bare package over its
    installed folder, and `sglang.srt.utils.common.torch_release` where that module is absent."""
    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])

    def bare(name: str) -> None:
        if name not in sys.modules:  # a package with a spec (find_spec keeps working), no __init__ run
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = importlib.util.module_from_spec(spec)

    parts = module.split(".")[:-1]
    for i in range(1, len(parts) + 1):
        bare(".".join(parts[:i]))
    if "sglang.srt.utils.common" not in sys.modules:
        from packaging import version

        bare("sglang.srt")
        bare("sglang.srt.utils")
        common = types.ModuleType("sglang.srt.utils.common")
        common.torch_release = version.parse(torch.__version__).release
        sys.modules[common.__name__] = common


def packed_decode_kernel():
    """SGLang's fused_recurrent_gated_delta_rule_packed_decode (imported on first use)."""
    global _kernel
    if _kernel is None:
        if "sglang" not in sys.modules:
            _bare_packages(KERNEL_MODULE)
        _kernel = importlib.import_module(KERNEL_MODULE).fused_recurrent_gated_delta_rule_packed_decode
    return _kernel


def gdn_decode_packed_sglang(mixed_qkv, a, b, A_log, dt_bias, state_pool, state_indices, out, scale):
    if not state_pool[0].is_contiguous():  # SGLang's kernel steps slots by stride(0), nothing else
        raise ValueError("sglang_packed_decode: each slot of state_pool must be contiguous")
    slots = slot_guard.safe_slots(state_indices, state_pool.shape[0])
    packed_decode_kernel()(mixed_qkv=mixed_qkv, a=a, b=b, A_log=A_log, dt_bias=dt_bias,
                           scale=scale or state_pool.shape[-1] ** -0.5, initial_state=state_pool, out=out,
                           ssm_state_indices=slots, use_qk_l2norm_in_kernel=True)
    return out, state_pool


for _hq, _hv in PACKED_HEADS.values():
    variant(packed_name(_hq, _hv), "sglang_packed_decode", backend="library", archs=("sm90", "sm100"),
            requires=("sglang", "triton", "cuda.core"), baseline=True, strided=True)(gdn_decode_packed_sglang)
