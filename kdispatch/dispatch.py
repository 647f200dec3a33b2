"""Per-definition dispatch: tensor signature -> (validated once) -> generated router -> variant.

Hot path (a signature seen before): one dict lookup on the first tensor's shape, one C++ guard
check of every tensor's dtype, device, sizes and strides, and the variant call. Everything else
(argument checking, shape features, the router, `supports`, the baseline) runs once per new
signature. Nothing here reads device memory, so dispatch is safe under CUDA-graph capture.

Fallbacks to the definition's baseline: no router for the architecture, the router names an
unknown or unavailable variant, the variant does not support the shape, or it raises (then a
warning is printed once per variant and the signature keeps the baseline from then on).
"""
from __future__ import annotations

import importlib
import operator
import warnings

from kdispatch import arch as _arch
from kdispatch import definitions, registry
from kdispatch.validate import Checker

try:  # dynamo's C++ tensor guard: ~0.1 us per tensor, several times cheaper than reading .shape/.dtype
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except Exception:  # pragma: no cover - older or stripped torch builds
    _TensorGuards = None

MAX_ENTRIES_PER_SHAPE = 8


def _py_signature(tensors):
    return tuple((t.dtype, t.device, t.shape, t.stride(), t.requires_grad) for t in tensors)


def make_guard(tensors):
    """A callable(*tensors) -> bool that is True exactly when every tensor has the same
    dtype, device, sizes and strides as `tensors`."""
    if _TensorGuards is not None:
        try:
            g = _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                              dynamic_dims_strides=[list(t.stride()) for t in tensors])
            if g.check(*tensors):
                return g.check
        except Exception:
            pass
    sig = _py_signature(tensors)
    return lambda *ts: _py_signature(ts) == sig


class _Entry:
    __slots__ = ("guard", "fn", "variant", "axes", "arch")

    def __init__(self, guard, variant, axes, arch):
        self.guard, self.fn, self.variant, self.axes, self.arch = guard, variant.fn, variant, axes, arch


class Dispatcher:
    """Callable with the definition's inputs in order; returns the definition's outputs."""

    def __init__(self, definition: str):
        self.definition = definitions.resolve_name(definition)
        self.short = definitions.FULL_TO_SHORT[self.definition]
        self.checker = Checker(definitions.load(self.definition), f"kdispatch.ops.{self.short}")
        self._tensors = operator.itemgetter(*self.checker.tensor_positions)
        self._entries: dict = {}  # first tensor's shape -> [_Entry]
        self._routers: dict = {}  # arch -> route(**axes) -> variant name, or None
        self._failed: set = set()  # (variant name, arch, axes) that raised
        self._warned: set = set()

    def __call__(self, *args):
        try:
            ts = self._tensors(args)
            bucket = self._entries.get(ts[0].shape, ())
        except (IndexError, AttributeError):  # too few arguments, or not a tensor: the checker says which
            bucket = ()
        for e in bucket:
            if e.guard(*ts):
                try:
                    return e.fn(*args)
                except Exception as exc:
                    return self._variant_failed(e, exc, args)
        return self._new_signature(args)

    # ---- slow path -------------------------------------------------------------------------
    def _new_signature(self, args):
        axes = self.checker.check(args)  # ValueError on bad input, before any kernel runs
        ts = self._tensors(args)
        arch = _arch.arch_of(ts[0].device)
        e = _Entry(make_guard(ts), self.choose(arch, axes), tuple(axes.items()), arch)
        bucket = self._entries.setdefault(ts[0].shape, [])
        bucket.insert(0, e)
        del bucket[MAX_ENTRIES_PER_SHAPE:]
        try:
            return e.fn(*args)
        except Exception as exc:
            return self._variant_failed(e, exc, args)

    def choose(self, arch: str, axes: dict) -> registry.Variant:
        """The variant for these shape features on `arch` (the baseline on any miss)."""
        base = registry.baseline(self.definition, arch)
        name = None
        route = self.router(arch)
        if route is not None:
            name = route(**axes)
        if name is None or name == base.name or (name, arch, tuple(axes.items())) in self._failed:
            return base
        try:
            v = registry.get(self.definition, name)
        except KeyError:
            self._warn_once(("unknown", name), f"router for {arch} names unknown variant {name!r}")
            return base
        if v.why_not(arch) is not None or not v.supports(axes):
            return base
        return v

    def router(self, arch: str):
        if arch not in self._routers:
            try:
                mod = importlib.import_module(f"kdispatch.routers.{arch}.{self.definition}")
                self._routers[arch] = mod.route
            except ModuleNotFoundError:
                self._routers[arch] = None
        return self._routers[arch]

    def set_router(self, arch: str, route) -> None:
        """Replace the router of `arch` (None: baseline only); forgets every cached decision."""
        self._routers[arch] = route
        self.reset()

    def reset(self) -> None:
        self._entries.clear()
        self._failed.clear()

    def _variant_failed(self, e: _Entry, exc: Exception, args):
        base = registry.baseline(self.definition, e.arch)
        if e.variant is base:
            raise exc
        self._failed.add((e.variant.name, e.arch, e.axes))
        self._warn_once(("failed", e.variant.name),
                        f"variant {e.variant.name!r} raised {type(exc).__name__}: {exc} on {dict(e.axes)}; "
                        f"serving the baseline {base.name!r} for this shape from now on")
        e.fn, e.variant = base.fn, base
        return base.fn(*args)

    def _warn_once(self, key, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"kdispatch.ops.{self.short}: {msg}", RuntimeWarning, stacklevel=4)
