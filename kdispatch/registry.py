"""The variant registry: every implementation of every definition, with what it needs to run.

A variant module registers itself with the `variant` decorator:

    @variant("gdn_decode", "triton_splitv", backend="triton", archs=("sm90",),
             supports=lambda f: None if f["batch_size"] <= 64 else "more than 64 sequences")
    def gdn_decode_splitv(q, k, v, state, A_log, a, dt_bias, b, scale): ...

`supports(features)` is a cheap pure function of the shape features (the variable axes): None (or
True) when the variant takes the shape, else a short reason (False: no reason given);
`Variant.declines` returns that reason, which `kdispatch explain` shows.

Launch configurations are candidates, not hand-set ladders: `configs={label: kwargs}` registers one
variant per configuration, named `<name>.<label>`, whose callable passes `kwargs` to the decorated
one; with `configs`, `supports` is called as `supports(features, kwargs)`. The tuner measures each
like any variant, the router picks per region, and the router header lists what each label sets.

Provenance is computed, not listed (kdispatch/provenance.py): the defining module, the project
modules and kernel sources it uses, transitively, and for a library variant the library's version.

`discover()` imports `kdispatch.baselines` (the reference of every definition) and every module
under `kdispatch.kernels`; a module that fails to import (a missing package, say) is recorded with
the reason and `kdispatch list` shows it. Baselines: per (definition, architecture) the registered
`baseline=True` variant that can run there, else the definition's reference ("reference", on every
device).

A library whose kernel is compiled at its first call (FlashInfer's nvcc JIT: minutes) names a probe,
`ready=`: a no-argument callable, asked once per process after the package and architecture checks,
that returns None when the kernel is there without building it, else why not. A variant that is not
ready is not run, so the dispatcher's chain passes it by (and says why) instead of stalling a call,
and the tuner skips it instead of timing a build.

A library baseline that makes the engine's call safe (an index guard launched first) can name the
call as the engine makes it, `engine=`: the tuner gates the safe one and times the engine's, so that
regions are fitted against what an engine user has (the plugins hand calls routed to the baseline
back to the engine's own kernel), not against the guard's extra launch. It times the safe one too
(the row's metrics, "guarded"): where the baseline keeps a region, `kdispatch.ops` calls, which run
the safe one, take a variant that beats it there, and the plugins still hand them back (tuner/fit.py).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import pkgutil
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

from kdispatch import definitions, provenance

ANY_ARCH = "*"
BACKENDS = ("triton", "cuda", "cute", "library", "torch")
REFERENCE = "reference"


def _always(_features: dict) -> None:
    return None


@dataclass
class Variant:
    definition: str  # full definition name
    name: str
    fn: Callable
    backend: str
    archs: tuple[str, ...]  # e.g. ("sm90", "sm100"); ("*",) runs on any device, CPU included
    supports: Callable[[dict], object] = _always  # shape features -> None/True, or why not (str/False)
    requires: tuple[str, ...] = ()  # importable modules it needs (checked without importing them)
    baseline: bool = False
    meta: dict = field(default_factory=dict)  # provenance of landed candidates (author, parent, date)
    config: dict = field(default_factory=dict)  # the launch configuration a configured variant passes
    strided: bool = False  # honours the strides of the definition's `strided` inputs (last dim contiguous)
    engine_fn: Callable | None = None  # a guarded library baseline's call as the engine makes it: what is timed
    ready: Callable[[], str | None] | None = None  # None when its library kernel is built, else why not

    @cached_property
    def source(self) -> Path:
        """The file that defines the variant's callable."""
        return Path(inspect.getsourcefile(inspect.unwrap(self.fn))).resolve()

    @cached_property
    def files(self) -> frozenset[Path]:
        """Every file the variant depends on (kdispatch/provenance.py)."""
        return provenance.files_of(self.source)

    @cached_property
    def provenance(self) -> str:
        """sha256 (16 hex) over its files, name and library versions: a change is a new variant."""
        versions = provenance.library_versions(self.requires) if self.backend == "library" else None
        return provenance.digest(self.name, self.files, versions)

    @cached_property
    def missing(self) -> tuple[str, ...]:
        return tuple(m for m in self.requires if not _importable(m))

    def declines(self, features: dict) -> str | None:
        """None when the variant takes this shape, else why not."""
        try:
            answer = self.supports(features)
        except Exception as exc:
            return f"supports raised {type(exc).__name__}: {exc}"
        if answer is None or answer is True:
            return None
        return answer if isinstance(answer, str) and answer else "declined by its supports predicate"

    def why_not(self, arch: str) -> str | None:
        """None when the variant can run on `arch`, else the reason."""
        if self.missing:
            return "missing package " + ", ".join(self.missing)
        if ANY_ARCH not in self.archs and arch not in self.archs:
            return f"runs on {'/'.join(self.archs)}, not {arch}"
        return self.not_ready

    @cached_property
    def not_ready(self) -> str | None:
        """The `ready` probe's answer, asked once (a probe that raises counts as not ready)."""
        if self.ready is None:
            return None
        try:
            return self.ready()
        except Exception as exc:
            return f"readiness probe raised {type(exc).__name__}: {exc}"


def _importable(module: str) -> bool:
    """Can `module` be imported? Checks each parent first (find_spec of a dotted name imports the
    parent and raises when it is missing), without importing the module itself."""
    parts = module.split(".")
    try:
        return all(importlib.util.find_spec(".".join(parts[:i])) is not None for i in range(1, len(parts) + 1))
    except (ImportError, ValueError):
        return False


_VARIANTS: dict[str, dict[str, Variant]] = {}
# (definition, arch) -> its baseline: asked on every new call signature; cleared when a variant comes or goes
_BASELINES: dict[tuple[str, str], Variant] = {}
_IMPORT_FAILURES: dict[str, str] = {}  # module -> reason
_discovered = False


def variant(definition: str, name: str, *, backend: str, archs, supports=None, requires=(),
            baseline: bool = False, meta=None, configs: dict[str, dict] | None = None, strided: bool = False,
            engine: Callable | None = None, ready: Callable[[], str | None] | None = None):
    """Register the decorated callable as a variant of `definition` (full or short name), or with
    `configs` one variant per launch configuration, or with `engine` a library baseline's unguarded
    call (see the module docstring)."""
    if backend not in BACKENDS:
        raise ValueError(f"variant {name!r}: backend must be one of {BACKENDS}, got {backend!r}")
    if engine is not None and not (baseline and backend == "library"):
        raise ValueError(f"variant {name!r}: only a library baseline has an engine call of its own")
    if configs is not None and (baseline or not configs):
        raise ValueError(f"variant {name!r}: configs must be a non-empty dict, and a baseline has one configuration")

    def deco(fn):
        if configs is None:
            register(Variant(definition, name, fn, backend, tuple(archs), supports or _always, tuple(requires),
                             baseline, dict(meta or {}), strided=strided, engine_fn=engine, ready=ready))
            return fn
        for label, kwargs in configs.items():
            register(Variant(definition, f"{name}.{label}", _configured(fn, kwargs), backend, tuple(archs),
                             _configured_supports(supports, kwargs), tuple(requires), False, dict(meta or {}),
                             dict(kwargs), strided, ready=ready))
        return fn

    return deco


def _configured(fn: Callable, kwargs: dict) -> Callable:
    @functools.wraps(fn)  # provenance follows __wrapped__ to fn's module
    def call(*args, **kw):
        return fn(*args, **kwargs, **kw)

    return call


def _configured_supports(supports, kwargs: dict) -> Callable[[dict], object]:
    if supports is None:
        return _always
    return lambda features: supports(features, kwargs)


def register(v: Variant) -> Variant:
    v.definition = definitions.resolve_name(v.definition)
    table = _VARIANTS.setdefault(v.definition, {})
    old = table.get(v.name)
    if old is not None and old.source != v.source:
        raise ValueError(f"{v.definition}: variant name {v.name!r} registered twice ({old.source} and {v.source})")
    table[v.name] = v
    _BASELINES.clear()
    return v


def discover() -> None:
    """Register every definition's reference and import every kernel module, once (later calls are free)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    _register_missing_references()
    import kdispatch.kernels as kernels

    for info in pkgutil.walk_packages(kernels.__path__, kernels.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # a kernel module that cannot load must not break the others
            _IMPORT_FAILURES[info.name] = f"{type(exc).__name__}: {exc}"


def import_failures() -> dict[str, str]:
    discover()
    return dict(_IMPORT_FAILURES)


def _table(definition: str) -> dict[str, Variant]:
    """The variants of a definition, its reference registered first if it was added after discovery."""
    discover()
    full = definitions.resolve_name(definition)
    if REFERENCE not in _VARIANTS.get(full, {}):
        _register_missing_references()
    return _VARIANTS.get(full, {})


def _register_missing_references() -> None:
    baselines = importlib.import_module("kdispatch.baselines")
    for d in definitions.all_definitions():
        if REFERENCE not in _VARIANTS.get(d.name, {}):
            baselines.register_reference(d)


def variants(definition: str) -> list[Variant]:
    """Every registered variant of a definition, sorted by name."""
    table = _table(definition)
    return [table[k] for k in sorted(table)]


def get(definition: str, name: str) -> Variant:
    try:  # a full name and a registered variant: what dispatch asks on every new shape
        return _VARIANTS[definition][name]
    except KeyError:
        pass
    _table(definition)
    full = definitions.resolve_name(definition)
    try:
        return _VARIANTS[full][name]
    except KeyError:
        known = sorted(_VARIANTS.get(full, {}))
        raise KeyError(f"{full}: no variant {name!r}; registered: {known}") from None


def baseline(definition: str, arch: str, runs=None) -> Variant:
    """The baseline of (definition, arch): the official library call where it runs, else the reference.
    `runs(variant)`: whether it runs on the machine meant, where that is not this one (planning another
    machine's tune: its engine's package may not import here)."""
    found = None if runs else _BASELINES.get((definition, arch))
    if found is None:
        here = runs or (lambda v: v.why_not(arch) is None)
        found = next((v for v in variants(definition) if v.baseline and here(v)
                      and (ANY_ARCH in v.archs or arch in v.archs)), None) or get(definition, REFERENCE)
        if runs is None:
            _BASELINES[(definition, arch)] = found
    return found


def baseline_gaps(definition: str, arch: str) -> list[str]:
    """Why no library baseline serves (definition, arch), so that the reference does; [] when one does."""
    base = baseline(definition, arch)
    if base.name != REFERENCE:
        return []
    libs = [v for v in variants(definition) if v.baseline]
    if not libs:
        return ["no library baseline is registered for this definition"]
    return [f"baseline {v.name!r} {v.why_not(arch) or 'is not registered for ' + arch}" for v in libs]


def unregister(definition: str, name: str) -> None:
    """Remove a variant (tests, and candidates that are withdrawn). The reference cannot be removed."""
    if name == REFERENCE:
        raise ValueError("the reference variant cannot be unregistered")
    _VARIANTS.get(definitions.resolve_name(definition), {}).pop(name, None)
    _BASELINES.clear()


def forget_definition(definition: str) -> None:
    """Drops every variant of a definition, its reference included (before `definitions.remove`)."""
    _VARIANTS.pop(definitions.resolve_name(definition), None)
    _BASELINES.clear()
