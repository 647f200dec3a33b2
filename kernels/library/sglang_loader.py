"""Loads the SGLang 0.5.23 kernel modules the engine baselines call (GDN: kernels/library/gdn/sglang.py;
MoE: kernels/library/moe/sglang.py) without running SGLang's package `__init__` files, which start
its server stack (zmq, orjson, starlette, ...: absent on the GPU machine, where the wheel is only
unpacked, see benchmarks/stage_engines.sh), and without sgl_kernel (a CUDA extension built for
another torch).

Every package above a loaded module that is not imported yet is registered as a *bare* package
over its installed folder (its `__init__` does not run). What the loaded modules import from
SGLang's server side is provided by small stand-ins, listed in SRT_UTILS and STUBS below; each
restates SGLang 0.5.23's definition or, for code the baselines never call, raises if called. Where
`sglang` was imported for real (inside the engine), nothing is stubbed and the real modules are used.
"""
from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch


def _cuda_version() -> tuple[int, ...]:
    return tuple(map(int, torch.version.cuda.split("."))) if torch.version.cuda else (0, 0)


def _sm() -> int:
    if not torch.cuda.is_available():
        return 0
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def _ceil_align(x: int, y: int) -> int:
    return (x + y - 1) // y * y


# What the loaded modules take from `sglang.srt.utils(.common)` (whose real import pulls SGLang's
# server stack): SGLang 0.5.23's definitions, restated from torch.
SRT_UTILS = {
    "is_cuda": lambda: torch.cuda.is_available() and torch.version.cuda is not None,
    "is_hip": lambda: torch.version.hip is not None,
    "get_device_sm": _sm,
    "get_cuda_version": _cuda_version,
    "is_gfx95_supported": lambda: False,  # AMD only
    "is_sm90_supported": lambda: _sm() // 10 == 9 and _cuda_version() >= (12, 3),
    # the MoE modules' (fused_moe_triton_kernels, fp8_kernel, int8_kernel, patch_torch)
    "is_cpu": lambda: False,  # SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1) only
    "cpu_has_amx_support": lambda: False,  # Intel AMX CPU backend only
    "is_musa": lambda: False,  # Moore Threads only
    "is_xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available(),
    "is_npu": lambda: False,  # Ascend only
    "ceil_align": _ceil_align,
}


def _unavailable(name: str):
    def fn(*args, **kwargs):
        raise NotImplementedError(
            f"{name} is an SGLang JIT/AOT CUDA op that the kdispatch loader does not load "
            "(it needs SGLang's JIT toolchain or sgl_kernel); the baseline must not reach it")
    fn.__name__ = name.rsplit(".", 1)[-1]
    return fn


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__kd_stub__ = True
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


class _Env:
    """`envs.X.get()` of sglang.srt.environ for the one flag read here (SGLANG_USE_AITER)."""

    def __init__(self, default):
        self.default = default

    def get(self):
        return self.default


# Stand-in modules, registered only while the real ones are not imported (name -> factory).
# - sglang.srt.batch_invariant_ops: its real __init__ imports DeepGEMM's wrapper; the kernels
#   only ask whether batch-invariant mode is on (off unless the server enabled it).
# - sglang.srt.layers.moe.utils: the real module imports dp_attention / runtime_context; the
#   kernels only call get_moe_padding_size (0 unless SGLANG_MOE_PADDING=1, 128 for aiter).
# - sglang.kernels.ops.quantization.{per_token_group_quant, per_tensor_quant_fp8} and the
#   package attribute sgl_per_token_quant_fp8: JIT CUDA ops fp8_kernel/int8_kernel bind at import
#   on CUDA; their loading needs SGLang's JIT toolchain (tvm-ffi, msgspec, nvcc). Placeholders that
#   raise: the baseline quantises with SGLang's Triton kernel instead.
# - sglang.kernels.ops.moe.moe_route_radix: JIT CUDA router that moe_fused_gate imports but only
#   dispatches to for ungrouped routing (num_expert_group <= 1), never for DeepSeek-V3.
STUBS = {
    "sglang.srt.batch_invariant_ops": lambda: _module(
        "sglang.srt.batch_invariant_ops", is_batch_invariant_mode_enabled=lambda: False),
    "sglang.srt.layers.moe.utils": lambda: _module(
        "sglang.srt.layers.moe.utils",
        get_moe_padding_size=lambda is_aiter_moe: 128 if is_aiter_moe else (
            128 if bool(int(os.getenv("SGLANG_MOE_PADDING", "0"))) else 0)),
    "sglang.kernels.ops.quantization.per_token_group_quant": lambda: _module(
        "sglang.kernels.ops.quantization.per_token_group_quant",
        per_token_group_quant=_unavailable("per_token_group_quant.per_token_group_quant")),
    "sglang.kernels.ops.quantization.per_tensor_quant_fp8": lambda: _module(
        "sglang.kernels.ops.quantization.per_tensor_quant_fp8",
        per_tensor_quant_fp8=_unavailable("per_tensor_quant_fp8.per_tensor_quant_fp8")),
    "sglang.kernels.ops.moe.moe_route_radix": lambda: _module(
        "sglang.kernels.ops.moe.moe_route_radix", covered=lambda *a, **k: False,
        route_radix=_unavailable("moe_route_radix.route_radix")),
}
# Attributes set on bare packages (never on real ones): package -> {name: value}.
PACKAGE_ATTRS = {
    "sglang.kernels.ops.quantization": {
        "sgl_per_token_quant_fp8": _unavailable("quantization.sgl_per_token_quant_fp8")},
}


def _root() -> Path:
    return Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


def _is_bare(module: types.ModuleType) -> bool:
    """A bare package or a stand-in of this loader: no __file__."""
    return getattr(module, "__file__", None) is None


def _bare(name: str) -> types.ModuleType:
    """`name` as a package over its installed folder, its __init__ not run (kept if imported)."""
    if name not in sys.modules:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(_root().joinpath(*name.split(".")[1:]))]
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
    return sys.modules[name]


def _bare_parents(module: str) -> None:
    parts = module.split(".")[:-1]
    for i in range(1, len(parts) + 1):
        _bare(".".join(parts[:i]))


def _srt_utils() -> None:
    """`sglang.srt.utils(.common)` stand-ins (bare package and module)."""
    from packaging import version

    _bare("sglang.srt")
    utils = _bare("sglang.srt.utils")
    common = sys.modules.get("sglang.srt.utils.common")
    if common is None:
        common = _module("sglang.srt.utils.common")
        common.torch_release = version.parse(torch.__version__).release
        sys.modules[common.__name__] = common
    if getattr(common, "__file__", None):  # the real module: leave it alone
        return
    for name, fn in SRT_UTILS.items():
        if not hasattr(common, name):
            setattr(common, name, fn)
        if _is_bare(utils) and not hasattr(utils, name):
            setattr(utils, name, fn)


# The names of `sglang.kernels.jit.utils` (whose __init__ also imports SGLang's JIT compiler,
# which needs msgspec and tvm-ffi) that live in its pure-Python `arch` and `common` modules.
JIT_UTILS_NAMES = {
    "arch": ("get_activation_cuda_cflags", "get_jit_cuda_arch", "is_arch_support_pdl",
             "override_jit_cuda_arch"),
    "common": ("aligned_new_empty", "cache_once", "device_guard", "empty_sentinel",
               "get_ci_test_range", "is_hip_runtime", "is_musa_runtime", "lazy_register_class",
               "should_run_full_tests"),
}


def _jit_utils() -> None:
    """`sglang.kernels.jit.utils` bare, with the names of its arch/common modules."""
    for name in ("sglang.kernels", "sglang.kernels.jit"):
        _bare(name)
    jit_utils = _bare("sglang.kernels.jit.utils")
    if not _is_bare(jit_utils):
        return
    for sub, names in JIT_UTILS_NAMES.items():
        source = importlib.import_module(f"sglang.kernels.jit.utils.{sub}")
        for name in names:
            if not hasattr(jit_utils, name):
                setattr(jit_utils, name, getattr(source, name))


def _prepare(modules) -> None:
    if "sglang" in sys.modules and not _is_bare(sys.modules["sglang"]):
        return  # SGLang itself is imported: use its real modules
    for module in modules:
        _bare_parents(module)
    _srt_utils()
    _jit_utils()
    for name, make in STUBS.items():
        if name not in sys.modules:
            _bare_parents(name)
            sys.modules[name] = make()
    for package, attrs in PACKAGE_ATTRS.items():
        pkg = _bare(package)
        if _is_bare(pkg):
            for key, value in attrs.items():
                if not hasattr(pkg, key):
                    setattr(pkg, key, value)


@functools.lru_cache(maxsize=None)
def sglang_function(module: str, name: str):
    """`name` from SGLang's `module`, imported on first use (bare packages and stubs, see the top)."""
    _prepare((module,))
    return getattr(importlib.import_module(module), name)
