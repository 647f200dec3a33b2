"""Every kdispatch op as a torch custom op, `torch.ops.kdispatch.<op>`, for torch.compile and for
engines that wrap kernels in custom ops of their own.

The schema is generated from the definition's JSON: tensor inputs are `Tensor`, scalar inputs
`float` or `int`, and an input the op writes in place (the spec's `in_place`: the GDN state) is
marked mutated, `Tensor(a!)`; the spec's call-time hints are optional keyword-only `SymInt?`. A custom op may not return an alias of an input, so it returns only
the outputs that are not written in place; `install` puts the in-place ones back into the
definition's output tuple. The fake implementation allocates the returned outputs from the
definition's output shapes, each axis taken from the first input dimension that carries it, so
symbolic sizes flow through torch.compile.

`kdispatch.ops.<op>` calls its Dispatcher, which runs the dispatch itself in eager code (the custom op's
trip through torch's dispatcher costs ~2 us a call more, beyond the dispatch budget) and the custom op
only while torch.compile traces it (`torch.compiler.is_compiling`, ~0.1 us); inside the compiled graph the
custom op runs the same Dispatcher, so routing, fallbacks and the call-mode choice are unchanged.
"""
from __future__ import annotations

import string
from typing import Callable

import torch

from kdispatch import definitions
from kdispatch.workloads import DTYPES

NAMESPACE = "kdispatch"
_SCALAR_TYPES = {"float32": "float", "float64": "float", "float16": "float", "bfloat16": "float",
                 "int32": "int", "int64": "int", "bool": "bool"}


def returned_outputs(d: definitions.Definition) -> list[str]:
    """The outputs the custom op returns: those not written into an input."""
    return [o for o in d.outputs if o not in d.spec.in_place]


def schema(d: definitions.Definition) -> str:
    """The custom op's schema, e.g. `(Tensor q, Tensor(a!) state, float scale) -> Tensor`."""
    mutated = set(d.spec.in_place.values())
    aliases = iter(string.ascii_lowercase)
    params = []
    for name, inp in d.data["inputs"].items():
        if inp.get("shape") is None:
            params.append(f"{_SCALAR_TYPES[inp['dtype']]} {name}")
        else:
            params.append(f"Tensor({next(aliases)}!) {name}" if name in mutated else f"Tensor {name}")
    if d.spec.hints:
        params += ["*"] + [f"SymInt? {h}=None" for h in d.spec.hints]
    n = len(returned_outputs(d))
    ret = "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
    return f"({', '.join(params)}) -> {ret}"


def fake_outputs(d: definitions.Definition) -> Callable:
    """Outputs with the definition's shapes and dtypes, sizes taken from the inputs (symbolic under
    torch.compile), on the first tensor input's device."""
    in_shapes = [d.data["inputs"][n].get("shape") for n in d.inputs]
    outs = [(d.data["outputs"][o]["shape"], DTYPES[d.data["outputs"][o]["dtype"]]) for o in returned_outputs(d)]
    const = d.const_axes

    def fake(*args, **hints):
        axes, device = dict(const), None
        for shape, x in zip(in_shapes, args):
            if shape is not None:
                device = device or x.device
                for axis, size in zip(shape, x.shape):
                    axes.setdefault(axis, size)
        res = tuple(torch.empty([axes[a] for a in shape], dtype=dtype, device=device) for shape, dtype in outs)
        return None if not res else res[0] if len(res) == 1 else res

    return fake


_LIB = torch.library.Library(NAMESPACE, "DEF")  # owns the definitions: kept for the process's lifetime


def register(dispatcher) -> torch._ops.OpOverload:
    """Defines `kdispatch::<short>` running `dispatcher` (once per process; returns the op).

    Defined through `torch.library.Library` with one CompositeExplicitAutograd kernel rather than
    `torch.library.custom_op`, whose Python autograd and aliasing layers cost 12-70 us a call on a
    2-core CPU where this path costs ~2.3 us (benchmarks/dispatch_overhead.py)."""
    d = definitions.get(dispatcher.definition)
    keep = [d.outputs.index(o) for o in returned_outputs(d)]
    single_output = len(d.outputs) == 1

    def run(*args, **hints):
        outs = dispatcher(*args, **hints)
        if single_output:
            return outs if keep else None
        res = tuple(outs[i] for i in keep)
        return None if not res else res[0] if len(res) == 1 else res  # a schema returning () wants None

    _LIB.define(d.short + schema(d))
    _LIB.impl(d.short, run, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{d.short}", fake_outputs(d), lib=_LIB)
    return getattr(getattr(torch.ops, NAMESPACE), d.short).default


def install(dispatcher):
    """Registers `dispatcher`'s custom op and makes it what the dispatcher runs while torch.compile
    traces a call (`Dispatcher.traced`), returning the definition's outputs in definition order
    (in-place outputs are the inputs they were written to); returns the dispatcher."""
    d = definitions.get(dispatcher.definition)
    op = register(dispatcher)
    # per output: ("input", position of the input written in place) or ("op", position in the op's result)
    returned = returned_outputs(d)
    where = [("input", d.inputs.index(d.spec.in_place[o])) if o in d.spec.in_place else ("op", returned.index(o))
             for o in d.outputs]
    several = len(returned) > 1

    def traced(*args, **hints):
        res = op(*args, **hints)
        if len(where) == 1 and where[0][0] == "op":
            return res
        res = res if several else (res,)
        return tuple(args[i] if kind == "input" else res[i] for kind, i in where)

    dispatcher.traced = traced
    return dispatcher
