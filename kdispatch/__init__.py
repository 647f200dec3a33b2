"""kdispatch: shape-aware dispatch of LLM-serving GPU kernels.

    import kdispatch
    out, new_state = kdispatch.ops.gdn_decode(q, k, v, state, A_log, a, dt_bias, b, scale)
    kdispatch.warmup("gdn_decode", [{"batch_size": 64}], "cuda")  # before graph capture (kdispatch.ops.warmup)

Submodules load on first use so that `import kdispatch` stays cheap.
"""
import importlib

__version__ = "0.1.0"
_LAZY = ("ops", "registry", "definitions", "spec", "checks", "workloads", "dispatch", "arch", "nvrtc", "provenance")


def __getattr__(name):
    if name in _LAZY:
        return importlib.import_module(f"kdispatch.{name}")
    if name == "warmup":
        return importlib.import_module("kdispatch.ops").warmup
    raise AttributeError(f"module 'kdispatch' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY) + ["warmup"])
