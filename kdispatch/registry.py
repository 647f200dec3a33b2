"""The variant registry: every implementation of every definition, with what it needs to run.

A variant module registers itself with the `variant` decorator:

    @variant("gdn_decode", "triton_splitv", backend="triton", archs=("sm90",),
             supports=lambda f: f["batch_size"] <= 64)
    def gdn_decode_splitv(q, k, v, state, A_log, a, dt_bias, b, scale): ...

`discover()` imports `kdispatch.baselines` and every module under `kdispatch.kernels`; a module
that fails to import (a missing package, say) is recorded with the reason and `kdispatch list`
shows it. Baselines: per (definition, architecture) the registered `baseline=True` variant that
can run there, else the project's reference (registered for every device as "reference").
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import pkgutil
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

from kdispatch import definitions

ANY_ARCH = "*"
BACKENDS = ("triton", "cuda", "cute", "library", "torch")
REFERENCE = "reference"


def _always(_features: dict) -> bool:
    return True


@dataclass
class Variant:
    definition: str  # full definition name
    name: str
    fn: Callable
    backend: str
    archs: tuple[str, ...]  # e.g. ("sm90", "sm100"); ("*",) runs on any device, CPU included
    supports: Callable[[dict], bool] = _always  # pure predicate over the shape features
    requires: tuple[str, ...] = ()  # importable modules it needs (checked without importing them)
    sources: tuple[Path, ...] = ()
    baseline: bool = False
    meta: dict = field(default_factory=dict)  # provenance of landed candidates (author, parent, date)

    @cached_property
    def provenance(self) -> str:
        """sha256 (16 hex) over the variant's source files: a changed file is a new variant."""
        h = hashlib.sha256()
        for p in sorted(self.sources):
            h.update(p.name.encode())
            h.update(p.read_bytes())
        return h.hexdigest()[:16]

    @cached_property
    def missing(self) -> tuple[str, ...]:
        return tuple(m for m in self.requires if importlib.util.find_spec(m) is None)

    def why_not(self, arch: str) -> str | None:
        """None when the variant can run on `arch`, else the reason."""
        if self.missing:
            return "missing package " + ", ".join(self.missing)
        if ANY_ARCH not in self.archs and arch not in self.archs:
            return f"runs on {'/'.join(self.archs)}, not {arch}"
        return None


_VARIANTS: dict[str, dict[str, Variant]] = {}
_IMPORT_FAILURES: dict[str, str] = {}  # module -> reason
_discovered = False


def variant(definition: str, name: str, *, backend: str, archs, supports=None, requires=(),
            sources=(), baseline: bool = False, meta=None):
    """Register the decorated callable as a variant of `definition` (full or short name).

    `sources`: extra files (e.g. a .cu kernel) hashed into the provenance with the defining module.
    """
    if backend not in BACKENDS:
        raise ValueError(f"variant {name!r}: backend must be one of {BACKENDS}, got {backend!r}")
    full = definitions.resolve_name(definition)

    def deco(fn):
        own = Path(inspect.getsourcefile(inspect.unwrap(fn))).resolve()  # unwrap: @torch.no_grad() etc.
        register(Variant(full, name, fn, backend, tuple(archs), supports or _always, tuple(requires),
                         (own, *(Path(s).resolve() for s in sources)), baseline, dict(meta or {})))
        return fn

    return deco


def register(v: Variant) -> Variant:
    table = _VARIANTS.setdefault(v.definition, {})
    old = table.get(v.name)
    if old is not None and old.sources != v.sources:
        raise ValueError(f"{v.definition}: variant name {v.name!r} registered twice ({old.sources[0]} and {v.sources[0]})")
    table[v.name] = v
    return v


def discover() -> None:
    """Import the baselines and every kernel module once (later calls are free)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    importlib.import_module("kdispatch.baselines")
    import kdispatch.kernels as kernels

    for info in pkgutil.walk_packages(kernels.__path__, kernels.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # a kernel module that cannot load must not break the others
            _IMPORT_FAILURES[info.name] = f"{type(exc).__name__}: {exc}"


def import_failures() -> dict[str, str]:
    discover()
    return dict(_IMPORT_FAILURES)


def variants(definition: str) -> list[Variant]:
    """Every registered variant of a definition, sorted by name."""
    discover()
    table = _VARIANTS.get(definitions.resolve_name(definition), {})
    return [table[k] for k in sorted(table)]


def get(definition: str, name: str) -> Variant:
    discover()
    full = definitions.resolve_name(definition)
    try:
        return _VARIANTS[full][name]
    except KeyError:
        known = sorted(_VARIANTS.get(full, {}))
        raise KeyError(f"{full}: no variant {name!r}; registered: {known}") from None


def baseline(definition: str, arch: str) -> Variant:
    """The baseline of (definition, arch): the official library call where it runs, else the reference."""
    for v in variants(definition):
        if v.baseline and v.why_not(arch) is None and (ANY_ARCH in v.archs or arch in v.archs):
            return v
    return get(definition, REFERENCE)


def unregister(definition: str, name: str) -> None:
    """Remove a variant (tests, and candidates that are withdrawn). The reference cannot be removed."""
    if name == REFERENCE:
        raise ValueError("the reference variant cannot be unregistered")
    _VARIANTS.get(definitions.resolve_name(definition), {}).pop(name, None)
