"""The reference of every definition, registered as the variant "reference" on every device.

Its `run` is the module the definition's spec names (kdispatch/references/<short>.py, whose text is
the definition JSON's `reference`). Where the spec lists an output that is an input updated in
place (the GDN state), the wrapper writes the reference's result into that input and returns it,
as the ops' contract says. The references are the gate's oracle everywhere and the baseline where
no library call runs (registry.baseline). The library baselines live with the other variants in
kernels/library/<family>/.
"""
from __future__ import annotations

import functools

from kdispatch import definitions
from kdispatch.registry import ANY_ARCH, REFERENCE, variant


def _in_place(d: definitions.Definition, run):
    """`run` with its in-place outputs copied into the inputs they belong to."""
    pairs = [(d.outputs.index(o), d.inputs.index(i)) for o, i in d.spec.in_place.items()]

    @functools.wraps(run)  # provenance follows __wrapped__ to the reference module
    def call(*args):
        out = run(*args)
        result = list(out) if isinstance(out, (tuple, list)) else [out]
        for o, i in pairs:
            result[o] = args[i].copy_(result[o])
        return tuple(result) if len(result) > 1 else result[0]

    return call


def register_reference(d: definitions.Definition) -> None:
    """Registers the reference of one definition (the registry calls this for every definition
    that lacks one, so definitions added later, by a test or an out-of-tree operator, get theirs)."""
    run = d.reference_module().run
    variant(d.name, REFERENCE, backend="torch", archs=(ANY_ARCH,), strided=True)(  # torch ops take any strides
        _in_place(d, run) if d.spec.in_place else run)
