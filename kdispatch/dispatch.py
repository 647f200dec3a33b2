"""Per-definition dispatch: tensor signature -> (validated once) -> generated router -> variant.

Hot path (a signature seen before): one dict lookup on the first tensor's shape, one C++ guard
check of every tensor's dtype, device, sizes and strides, and the variant call. Everything else
(argument checking, shape features, the router, `supports`, the baseline) runs once per new
signature. Nothing here reads device memory, so dispatch is safe under CUDA-graph capture.
A first tensor's shape seen for the first time gets a one-off decision: checked and routed for
this call's mode only, without a guard (building one costs more than the checks, and an engine's
prefill brings a new token count nearly every call); seen again, the signature is cached.

Call modes: a router may answer differently for calls captured in a CUDA graph (`route`, fitted on
graph times) and for eager calls (`route_eager`, fitted on eager host + device times). A signature
whose two answers differ asks, on each call, whether a graph is being captured (`capturing`, a
counter read); every other signature pays nothing for the distinction.

Strided calls: a signature that passes a strided view of an input the spec lists as `strided` is
served by the router's first choice declaring `strided`, else by its first runnable choice on
contiguous copies of those views (`explain` says which).

Fallbacks to the definition's baseline: no router for the architecture, the router names an
unknown or unavailable variant, the variant declines the shape (`Variant.declines`), or it raises
(then a warning is printed once per variant and the signature keeps the baseline from then on).
Where the torch reference serves a call on a GPU (orders of magnitude slower than a kernel), a
warning says so once per op, architecture and reason.

Run-time switches (environment variables, read when a Dispatcher is made and again by
`reload_switches()`, which also forgets every cached decision):
    KDISPATCH_DISABLE=1                      every op serves its baseline, whatever the router says
    KDISPATCH_FORCE_<OP>=<variant>           that op calls <variant> on every shape it can take,
                                             e.g. KDISPATCH_FORCE_GDN_DECODE=cuda_decode_warp_rows.r4cs;
                                             where it cannot (unknown name, not runnable here, a
                                             declined shape) the baseline serves, with a warning once
    KDISPATCH_CHECK=1                        checked mode: every call is validated in full, index
                                             values included (the spec's `check_values`), which
                                             synchronises with the device; a bad value raises
                                             ValueError naming the argument and its first bad position
Off the checked mode, index values are never read on the host: kernels treat out-of-range values
as padding (each definition's JSON says how). Constraints over scalar arguments alone are checked
on every call (validate.Checker.check_scalars).
`explain(arch, axes)` tells which variant a shape gets and why, through the same code as a call.

Engine plugins call the ops inside `handing_back_baseline()`: a call routed to the definition's
baseline, or into a region the router marks as handed back (`hands_back`: a variant that beats the
guarded baseline there but not the engine's own call), then raises `BaselineChosen` before anything
runs, and the plugin calls the engine's own kernel instead, as the engine would have (no guard
launch, no wrapper host time).
"""
from __future__ import annotations

import collections
import contextvars
import dataclasses
import functools
import importlib
import operator
import os
import warnings
from dataclasses import dataclass, field

import torch

from kdispatch import arch as _arch
from kdispatch import definitions, registry
from kdispatch.validate import Checker

try:  # dynamo's C++ tensor guard: ~0.1 us per tensor, several times cheaper than reading .shape/.dtype
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except Exception:  # pragma: no cover - older or stripped torch builds
    _TensorGuards = None

MAX_ENTRIES_PER_SHAPE = 8
MAX_SEEN_ONCE = 4096  # first tensors' shapes remembered as seen once (oldest forgotten first)
MODES = ("graph", "eager")

_HAND_BACK = contextvars.ContextVar("kdispatch_hand_back_baseline", default=False)
_is_compiling = torch.compiler.is_compiling


class BaselineChosen(Exception):
    """A call inside `handing_back_baseline()` was routed to the definition's baseline; nothing ran."""


class handing_back_baseline:  # noqa: N801 - used as a function: `with handing_back_baseline():`
    """Calls in this context that the router sends to the baseline raise BaselineChosen instead. A
    class rather than a generator: a plugin enters it on every call (0.35 us against 1 us)."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _HAND_BACK.set(True)

    def __exit__(self, *exc) -> None:
        _HAND_BACK.reset(self._token)

_captures = 0  # CUDA graphs being captured in this process through torch.cuda.CUDAGraph


def capturing() -> bool:
    """Is a CUDA graph being captured? A counter kept by `_count_captures`: reading it costs tens of
    nanoseconds, where asking CUDA about the current stream (torch.cuda.is_current_stream_capturing)
    cost 1.5 us a call on an H100 host (benchmarks/dispatch_overhead.py). Every capture path of torch
    (torch.cuda.graph, make_graphed_callables, torch.compile's CUDA graphs), and so of SGLang and vLLM,
    goes through torch.cuda.CUDAGraph; a capture begun some other way is not seen, and its calls get
    the eager choice (which, where it cannot be captured, makes that capture fail loudly)."""
    return _captures > 0


def _count_captures() -> None:
    """Wraps torch.cuda.CUDAGraph.capture_begin/capture_end (once) to keep `_captures`."""
    graph = torch.cuda.CUDAGraph
    if getattr(graph.capture_begin, "_kdispatch_counts", False):
        return
    begin, end = graph.capture_begin, graph.capture_end

    @functools.wraps(begin)
    def capture_begin(self, *args, **kwargs):
        global _captures
        begin(self, *args, **kwargs)
        _captures += 1

    @functools.wraps(end)
    def capture_end(self, *args, **kwargs):
        global _captures
        try:
            end(self, *args, **kwargs)
        finally:
            _captures = max(0, _captures - 1)

    capture_begin._kdispatch_counts = True
    graph.capture_begin, graph.capture_end = capture_begin, capture_end


if torch.backends.cuda.is_built():
    _count_captures()


def _py_signature(tensors):
    return tuple((t.dtype, t.device, t.shape, t.stride(), t.requires_grad) for t in tensors)


def _never(*tensors) -> bool:
    """The guard of a one-off decision: it serves its own call only."""
    return False


def make_guard(tensors, open_first: bool = False):
    """A callable(*tensors) -> bool that is True exactly when every tensor has the same
    dtype, device, sizes and strides as `tensors`; with `open_first`, any size of each tensor's
    first dimension (without dynamo's C++ guards: the same sizes)."""
    if _TensorGuards is not None:
        try:
            sizes = [[None, *t.shape[1:]] if open_first and t.dim() else list(t.shape) for t in tensors]
            g = _TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=[list(t.stride()) for t in tensors])
            if g.check(*tensors):
                return g.check
        except Exception:
            pass
    sig = _py_signature(tensors)
    return lambda *ts: _py_signature(ts) == sig


class _Entry:
    """One tensor signature's decision: `variant` for captured calls, `eager` for eager calls (None:
    the same variant, and the call mode is never asked). `base` / `eager_base`: whether an engine
    plugin gets the call back (`handing_back_baseline`): the baseline is chosen, or the router's
    region hands its calls back to the engine's own kernel (`hand_back`, per mode)."""

    __slots__ = ("guard", "fn", "variant", "eager", "eager_fn", "base", "eager_base", "axes", "arch", "strided",
                 "hand_back", "hinted")

    def __init__(self, guard, variant, eager, axes, arch, strided=False, hand_back=(False, False)):
        self.guard, self.axes, self.arch, self.strided, self.hand_back = guard, axes, arch, strided, hand_back
        # call mode -> {hint values: (variant, whether plugins get the call back)}
        self.hinted: dict = {"graph": {}, "eager": {}}
        self.set(variant, eager)

    def set(self, variant, eager) -> None:
        if variant is None:  # a one-off call its hints route (Dispatcher._one_off): `hinted` decides
            self.variant = self.fn = self.eager = self.eager_fn = None
            self.base = self.eager_base = False
            return
        graph_back, eager_back = self.hand_back
        self.variant, self.fn, self.base = variant, variant.fn, variant.baseline or graph_back
        self.eager = None if eager is variant and graph_back == eager_back else eager
        self.eager_fn = None if self.eager is None else eager.fn
        self.eager_base = self.base if self.eager is None else eager.baseline or eager_back


DISABLE_VAR = "KDISPATCH_DISABLE"
HINTED = "hinted "  # key prefix of a router's functions for calls that pass the call-time hints
MAX_HINTED_PER_ENTRY = 256  # hint values remembered per signature (a serving loop repeats few)
CONTIGUOUS_COPIES = " (on contiguous copies)"  # name suffix of a variant served on copies of strided views
CHECK_VAR = "KDISPATCH_CHECK"
HOST_ARCHS = ("cpu", "meta")  # where the reference is what runs anyway: no warning


def force_var(short: str) -> str:
    """The environment variable that forces a variant for one op."""
    return f"KDISPATCH_FORCE_{short.upper()}"


@dataclass
class Choice:
    """Which variant a shape gets on an architecture, and the steps that led there."""

    variant: registry.Variant
    router_says: str | None  # the router's first choice (None: no router, or not consulted)
    steps: list[str] = field(default_factory=list)  # why each earlier candidate was passed over
    chain: tuple[str, ...] = ()  # every variant the router named, in the order they are tried
    mode: str = "graph"  # the call mode this choice is for


class Dispatcher:
    """Callable with the definition's inputs in order; returns the definition's outputs."""

    def __init__(self, definition: str):
        d = definitions.get(definition)
        self.definition, self.short = d.name, d.short
        self.checker = Checker(d, f"kdispatch.ops.{self.short}")
        self._input_names = [n for n, _ in self.checker.inputs]
        self.hints = tuple(d.spec.hints)  # call-time hints the op takes as keyword arguments
        self._sole_hint = self.hints[0] if len(self.hints) == 1 else None
        self._in_place_positions = frozenset(self._input_names.index(i) for i in d.spec.in_place.values())
        self._check_values = d.spec.check_values
        self._tensors = operator.itemgetter(*self.checker.tensor_positions)
        self._entries: dict = {}  # first tensor's shape -> [_Entry]
        # first tensors' shapes that had a one-off decision (keys only). Both memos below drop their
        # oldest entry once full, at every new shape of a serving engine's prefills: an OrderedDict
        # pops it in O(1), where finding a dict's first key scans past the dropped ones' tombstones
        self._seen_once: collections.OrderedDict = collections.OrderedDict()
        # (arch, mode, strided, *features) -> (variant, whether plugins get the call back), for the
        # decisions not cached with a call signature: a plugin's `decision` and the one-off call
        # that follows it with the same features (a prefill's new token count) are routed once
        self._decisions: collections.OrderedDict = collections.OrderedDict()
        self._routers: dict = {}  # arch -> {mode: route(**axes) -> variant name(s)}, or None
        self._model_routers: dict = {}  # (arch, GPU model) -> the same, of the model's own router
        self._set_by_hand: set = set()  # archs whose router `set_router` replaced (model routers too)
        self._failed: set = set()  # (variant name, arch, axes) that raised
        self._copies: dict = {}  # variant name -> it on contiguous copies of strided views
        self._warned: set = set()
        # what a call runs while torch.compile traces it: the custom op (kdispatch.custom_ops.install)
        self.traced = None
        self.reload_switches()

    def reload_switches(self) -> None:
        """Reads KDISPATCH_DISABLE, KDISPATCH_CHECK and KDISPATCH_FORCE_<OP> again; forgets every
        cached decision."""
        self.disabled = os.environ.get(DISABLE_VAR, "").strip() not in ("", "0")
        self.checked = os.environ.get(CHECK_VAR, "").strip() not in ("", "0")
        self.forced = os.environ.get(force_var(self.short), "").strip() or None
        # run before every call: the full check in the checked mode, else the scalar constraints, if any
        self._per_call = (self.check_call if self.checked else
                          self.checker.check_scalars if self.checker.scalar_constraints else None)
        self.reset()

    def __call__(self, *args, **hints):
        if _is_compiling() and self.traced is not None:
            return self.traced(*args, **hints)
        values = None
        if hints:  # the common call passes the one hint as a non-negative int: checked here, inline
            v = hints.get(self._sole_hint) if len(hints) == 1 else None
            values = (v,) if type(v) is int and v >= 0 else self._hint_values(hints)
        if self._per_call is not None:
            self._per_call(args)
        try:
            ts = self._tensors(args)
            e = self._last  # a serving loop repeats its last signature: one guard, no lookup
            if e is None or not e.guard(*ts):
                e = next((c for c in self._entries.get(ts[0].shape, ()) if c.guard(*ts)), None)
        except (IndexError, AttributeError, TypeError):  # too few arguments, or not a tensor: the checker says which
            e = None
        if e is None:
            e = self._new_signature(args, values is not None)  # hints: they decide the call
        self._last = e
        if values is not None:  # routed with the hints: decided once per (signature, values, call mode)
            mode = "graph" if capturing() else "eager"
            v, base = e.hinted[mode].get(values) or self._hinted_decision(e, values, mode)
            if base and _HAND_BACK.get():
                raise BaselineChosen(self.short)
            try:
                return v.fn(*args)
            except Exception as exc:
                return self._hinted_failed(e, v, values, exc, args)
        if e.eager_fn is None or capturing():
            fn, base = e.fn, e.base
        else:
            fn, base = e.eager_fn, e.eager_base
        if base and _HAND_BACK.get():
            raise BaselineChosen(self.short)
        try:
            return fn(*args)
        except Exception as exc:
            return self._variant_failed(e, fn, exc, args)

    def _hint_values(self, hints: dict) -> tuple | None:
        """The call's hint values in the spec's order, or None where it passes none (all None)."""
        unknown = set(hints) - set(self.hints)
        if unknown:
            raise TypeError(f"kdispatch.ops.{self.short}: unexpected keyword argument(s) {sorted(unknown)} "
                            f"(its call-time hints: {list(self.hints) or 'none'})")
        values = tuple(hints.get(n) for n in self.hints)
        if all(v is None for v in values):
            return None
        if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
            raise ValueError(f"kdispatch.ops.{self.short}: hints {dict(zip(self.hints, values))} must all be given, "
                             "as non-negative ints")
        return values

    def _hinted_decision(self, e: _Entry, values: tuple, mode: str) -> tuple:
        """(variant, whether plugins get the call back) for a call passing these hint values in `mode`:
        routed with them as features (the router's `route_hinted`, where it has one), and kept."""
        cache = e.hinted[mode]
        if len(cache) >= MAX_HINTED_PER_ENTRY:
            cache.clear()
        hit = cache[values] = self.decision(e.arch, self._hinted_features(e, values), mode, e.strided)
        return hit

    def _hinted_failed(self, e: _Entry, v, values: tuple, exc: Exception, args):
        """A hinted call's variant raised: the baseline's error propagates; any other variant is
        marked failed for these features and the call goes to the next choice."""
        self._features_failed(v, e.arch, self._hinted_features(e, values), exc)
        for cache in e.hinted.values():
            cache.clear()
        return self(*args, **dict(zip(self.hints, values)))  # decided again, without it

    def _features_failed(self, v, arch: str, features: dict, exc: Exception) -> None:
        """Variant v raised on a call decided by these features: the baseline's error propagates;
        any other variant is marked failed for them (said once), and they are decided again."""
        name = v.name.split(CONTIGUOUS_COPIES)[0]
        if name == registry.baseline(self.definition, arch).name:
            raise exc
        self._failed.add((name, arch, tuple(features.items())))
        self._decisions.clear()
        self._warn_once(("failed", v.name), f"variant {v.name!r} raised {type(exc).__name__}: {exc} on "
                                             f"{features}; the next choice serves this shape from now on")

    def _hinted_features(self, e: _Entry, values: tuple) -> dict:
        """The shape features of entry e with the call's hint values (what `route_hinted` takes)."""
        return {**dict(e.axes), **dict(zip(self.hints, values))}

    def warm(self, *args) -> tuple[str, str]:
        """Routes this call signature now and runs the variant of each call mode once, so that what
        they compile (Triton, NVRTC) and the decision itself happen before a CUDA graph is captured.
        Writes the in-place outputs of `args`. Returns the (graph, eager) variant names."""
        ts = self._tensors(args)
        self._seen_once[ts[0].shape] = None  # cached on this call, not decided once
        self(*args)
        e = next(e for e in self._entries[ts[0].shape] if e.guard(*ts))
        if e.eager_fn is not None:  # the call above ran one mode's variant; run the other's
            fn = e.fn if not capturing() else e.eager_fn
            try:
                fn(*args)
            except Exception as exc:
                self._variant_failed(e, fn, exc, args)
        return e.variant.name, (e.eager or e.variant).name

    def check_call(self, args) -> None:
        """The checked mode's validation of one call: shapes, dtypes and constraints (device values
        included), then the definition's index-value rules. Synchronises with the device."""
        self.checker.check(args, sync=True)
        if self._check_values is not None:
            problem = self._check_values(dict(zip(self._input_names, args)))
            if problem is not None:
                arg, what = problem
                raise ValueError(f"kdispatch.ops.{self.short}: argument {arg!r}: {what} ({CHECK_VAR} is set)")

    # ---- slow path -------------------------------------------------------------------------
    def _new_signature(self, args, hinted: bool = False) -> _Entry:
        """The decision for a call signature not cached: one-off where its first tensor's shape is new
        (`_one_off`), else validated, routed for both call modes and cached."""
        try:
            key = self._tensors(args)[0].shape
        except (IndexError, AttributeError, TypeError):
            key = None  # malformed: the checker says how
        if key is not None and key not in self._seen_once and key not in self._entries:
            self._seen_once[key] = None
            if len(self._seen_once) > MAX_SEEN_ONCE:
                self._seen_once.popitem(last=False)
            return self._one_off(args, hinted)
        return self._cached_signature(args)

    def _one_off(self, args, hinted: bool = False) -> _Entry:
        """This call's decision, for its call mode only, with a guard that never matches. Inside
        `handing_back_baseline()` a call the router gives back raises BaselineChosen before any
        argument is checked: the engine's own kernel serves it, as without kdispatch. A call passing
        its hints (`hinted`) is routed by them (`_hinted_decision`): its entry carries no plain choice."""
        mode = "graph" if capturing() else "eager"
        decided = None
        if _HAND_BACK.get() and not hinted:
            try:
                decided = self._decide(self.checker.axes(args), args, mode)
            except (IndexError, AttributeError, TypeError):
                pass  # too malformed to read: checked below, which names the problem
            else:
                if decided.base:
                    raise BaselineChosen(self.short)
        axes = self.checker.check(args)  # ValueError on bad input, before any kernel runs
        if hinted:
            arch = _arch.arch_of(self._tensors(args)[0].device)
            return _Entry(_never, None, None, tuple(axes.items()), arch, self.checker.is_strided(args))
        if decided is None or decided.axes != tuple(axes.items()):
            decided = self._decide(axes, args, mode)
        return decided

    def _decide(self, axes: dict, args, mode: str) -> _Entry:
        """A one-off entry: the choice for these shape features in `mode`."""
        arch = _arch.arch_of(self._tensors(args)[0].device)
        strided = self.checker.is_strided(args)
        v, back = self.decision(arch, axes, mode, strided)
        return _Entry(_never, v, v, tuple(axes.items()), arch, strided, (back, back))

    def _cached_signature(self, args) -> _Entry:
        """Validates a call signature, routes both call modes and caches the entry."""
        axes = self.checker.check(args)  # ValueError on bad input, before any kernel runs
        ts = self._tensors(args)
        arch = _arch.arch_of(ts[0].device)
        strided = self.checker.is_strided(args)
        e = _Entry(make_guard(ts), self.choose(arch, axes, strided=strided),
                   self.choose(arch, axes, "eager", strided=strided), tuple(axes.items()), arch, strided,
                   (self.hands_back(arch, axes), self.hands_back(arch, axes, "eager")))
        bucket = self._entries.setdefault(ts[0].shape, [])
        bucket.insert(0, e)
        del bucket[MAX_ENTRIES_PER_SHAPE:]
        return e

    def choose(self, arch: str, axes: dict, mode: str = "graph", strided: bool = False) -> registry.Variant:
        """The variant for these shape features on `arch` in call mode `mode` (the baseline on any miss)."""
        c = self.explain(arch, axes, mode, strided)
        for step in c.steps:  # a forced variant that does not serve, or a router naming an unknown one
            if step.startswith(force_var(self.short)) or "unknown variant" in step:
                self._warn_once(("choice", step.split(";")[0]), step)
        if c.variant.name == registry.REFERENCE and arch not in HOST_ARCHS:
            why = self.reference_reasons(arch, c)
            self._warn_once(("reference", arch, why[0]),
                            f"serving the torch reference on {arch} (far slower than a kernel): {'; '.join(why)}")
        return c.variant

    def reference_reasons(self, arch: str, choice: Choice) -> list[str]:
        """Why a call on `arch` gets the torch reference (what the fallback warning and
        `kdispatch list` say)."""
        why = list(choice.steps) if choice.steps else (
            [f"the router for {arch} names the reference for this shape"] if choice.router_says == registry.REFERENCE
            else [f"no router for {arch}"] if self.router(arch) is None else [])
        return why + registry.baseline_gaps(self.definition, arch)

    def explain(self, arch: str, axes: dict, mode: str = "graph", strided: bool = False) -> Choice:
        """The variant a call with these shape features gets on `arch` in call mode `mode` (graph:
        captured in a CUDA graph; eager), with the reasons for every fallback on the way (what
        `kdispatch explain` prints; `choose` is this, nothing else). `strided`: the call passes
        strided views (spec `strided`): the first choice declaring `strided` serves; where none does,
        the first runnable choice (or the baseline) serves on contiguous copies of those views."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        base = registry.baseline(self.definition, arch)
        if strided and not base.strided:
            base = self._on_contiguous_copies(base)
        if self.disabled:
            return Choice(base, None, [f"{DISABLE_VAR} is set: the baseline serves every shape"], mode=mode)
        if self.forced is not None:
            chain, said, named = (self.forced,), None, ()

            def source() -> str:
                return force_var(self.short)
        else:
            routes = self.router(arch)
            if routes is None:
                return Choice(base, None, [f"no router for {arch}: the baseline serves"], mode=mode)
            route, features = self._route_fn(routes, axes, mode)
            answer = route(**features)  # a name, or the region's measured variants best first
            chain = (answer,) if isinstance(answer, str) or answer is None else tuple(answer)
            said = chain[0] if chain else None
            named = tuple(n for n in chain if n is not None)

            def source() -> str:  # only where a step is explained: one-off decisions (prefill) are hot
                hinted = route is not None and route in (routes.get(HINTED + "graph"), routes.get(HINTED + "eager"))
                tag = HINTED if hinted else ""
                own = routes is self._model_routers.get((str(arch), getattr(arch, "model", None)))
                return (f"router for {arch}" + (f" {arch.model}" if own else "")
                        + (f" (calls passing {', '.join(self.hints)})" if hinted else "")
                        + (" (eager calls)" if route is not routes[tag + "graph"] else ""))
        steps = []
        copies = None  # strided call: the first runnable choice that needs contiguous inputs
        for wanted in chain:
            if wanted is None or wanted == base.name.split(CONTIGUOUS_COPIES)[0]:
                break
            try:
                v = registry.get(self.definition, wanted)
            except KeyError:
                known = ", ".join(x.name for x in registry.variants(self.definition))
                steps.append(f"{source()}: names unknown variant {wanted!r} (known: {known})")
                continue
            why = v.why_not(arch)
            if why is None and self._failed and (wanted, arch, tuple(axes.items())) in self._failed:
                why = "raised on this shape earlier"
            if why is None and (declined := v.declines(axes)) is not None:
                why = f"declines {axes}: {declined}"
            if why is None and strided and not v.strided:
                copies = copies or v
                why = "takes contiguous inputs only (this call passes strided views)"
            if why is None:
                return Choice(v, said, steps, named, mode)
            steps.append(f"{source()}: {wanted!r} {why}")
        else:
            if steps and copies is None:
                steps[-1] += f"; serving the baseline {base.name!r}"
        if copies is not None:  # ranked before the baseline: faster on contiguous inputs, so on copies
            fallback = self._on_contiguous_copies(copies)
            steps.append(f"serving {fallback.name!r}: none of the choices takes strided views")
            return Choice(fallback, said, steps, named, mode)
        return Choice(base, said, steps, named, mode)

    def _on_contiguous_copies(self, v: registry.Variant) -> registry.Variant:
        """`v` called on contiguous copies of the strided inputs (for a variant that needs them);
        an input updated in place is copied back after the call, and returned in place of its copy.
        One object per variant, so that both call modes' choices are the same one."""
        if v.name in self._copies:
            return self._copies[v.name]
        positions, written = self.checker.strided_positions, self._in_place_positions
        fn = v.fn

        def call(*args):
            args, back = list(args), []
            for i in positions:
                x = args[i]
                if x is not None and not x.is_contiguous():
                    args[i] = x.contiguous()
                    if i in written:
                        back.append((x, args[i]))
            res = fn(*args)
            if not back:
                return res
            for x, c in back:
                x.copy_(c)
            swap = {id(c): x for x, c in back}
            return (tuple(swap.get(id(r), r) for r in res) if isinstance(res, tuple) else swap.get(id(res), res))

        self._copies[v.name] = dataclasses.replace(v, name=v.name + CONTIGUOUS_COPIES, fn=call, strided=True)
        return self._copies[v.name]

    def router(self, arch: str) -> dict | None:
        """{mode: route function, ("hand_back", mode): its hand-back function or None} of the
        generated router for `arch` (None: no router): the one fitted on its GPU model's measurements
        alone (routers/<arch>/<model>/, `arch.model`) where there is one, else the architecture's."""
        model = getattr(arch, "model", None)
        if model is not None and arch not in self._set_by_hand:
            key = (str(arch), model)
            if key not in self._model_routers:
                self._model_routers[key] = self._load_router(f"{arch}.{model}")
            if self._model_routers[key] is not None:
                return self._model_routers[key]
        if arch not in self._routers:
            self._routers[arch] = self._load_router(arch)
        return self._routers[arch]

    def _load_router(self, package: str) -> dict | None:
        try:
            mod = importlib.import_module(f"kdispatch.routers.{package}.{self.definition}")
        except ModuleNotFoundError:
            return None
        eager = hasattr(mod, "route_eager")  # then its hand-back answers are its own too
        routes = self._routes(mod.route, getattr(mod, "route_eager", None), getattr(mod, "hand_back", None),
                              getattr(mod, "hand_back_eager" if eager else "hand_back", None))
        hinted = getattr(mod, "route_hinted", None)  # calls that pass the call-time hints
        if hinted is not None:
            eager = hasattr(mod, "route_hinted_eager")
            routes.update(self._routes(
                hinted, getattr(mod, "route_hinted_eager", None), getattr(mod, "hand_back_hinted", None),
                getattr(mod, "hand_back_hinted_eager" if eager else "hand_back_hinted", None), HINTED))
        return routes

    @staticmethod
    def _routes(route, route_eager, hand_back, hand_back_eager, tag: str = "") -> dict:
        """The router's functions by (tag +) mode; tag HINTED: those for calls passing the hints."""
        return {tag + "graph": route, tag + "eager": route_eager or route, (tag + "hand_back", "graph"): hand_back,
                (tag + "hand_back", "eager"): hand_back_eager}

    def _route_fn(self, routes: dict, features: dict, mode: str, hand_back: bool = False):
        """The router function for these features in `mode` (the hinted one where they hold the
        hints and the router has one), and the features to call it with."""
        if self.hints and self.hints[0] in features:
            fn = routes.get((HINTED + "hand_back", mode) if hand_back else HINTED + mode)
            if fn is not None or (HINTED + "graph") in routes:
                return fn, features
            features = {k: x for k, x in features.items() if k not in self.hints}
        return routes.get(("hand_back", mode) if hand_back else mode), features

    def set_router(self, arch: str, route, route_eager=None, hand_back=None, hand_back_eager=None,
                   route_hinted=None) -> None:
        """Replace the router of `arch` (None: baseline only; `route_eager`: eager calls' answers,
        default `route`'s; `hand_back`: which shapes engine plugins give back to the engine's kernel,
        default none, and `hand_back_eager` for eager calls, default `hand_back`'s; `route_hinted`:
        the answers for calls that pass the call-time hints, both modes), for every GPU model of the
        architecture too; forgets every cached decision."""
        self._set_by_hand.add(str(arch))
        self._routers[arch] = None if route is None else self._routes(route, route_eager, hand_back,
                                                                      hand_back_eager or hand_back)
        if route is not None and route_hinted is not None:
            self._routers[arch].update(self._routes(route_hinted, None, None, None, HINTED))
        self.reset()

    def unset_router(self, arch: str) -> None:
        """Undoes `set_router`: the generated routers of `arch` serve again."""
        self._set_by_hand.discard(str(arch))
        self._routers.pop(arch, None)
        self.reset()

    def hands_back(self, arch: str, axes: dict, mode: str = "graph") -> bool:
        """Does the router send this shape's calls in `mode` back to the engine's own kernel when an
        engine plugin asks (its region won against the guarded baseline only: tuner/fit.py
        `hand_back`)? Never under KDISPATCH_DISABLE (the baseline anyway) or a forced variant."""
        routes = None if self.disabled or self.forced is not None else self.router(arch)
        if not routes:
            return False
        fn, features = self._route_fn(routes, axes, mode, hand_back=True)
        return bool(fn(**features)) if fn is not None else False

    def serve_decided(self, arch: str, features: dict, strided: bool, args, variant: registry.Variant | None = None):
        """An engine plugin's call that its own checks found covered (every tensor's layout, the
        counts across them) and that `decision` has just decided with these features (the
        definition's variable axes, and its hints where the engine knows them): served by
        `variant`, the variant that decision named (None: decided again here), with no signature
        look-up, validation or entry, which for a prefill of a new token count were most of the
        op's host time. BaselineChosen where the engine's kernel should serve it; a variant that
        raises is marked failed for these features and the next choice serves. The checked mode
        (KDISPATCH_CHECK) and torch.compile's tracing call the op as any caller does."""
        if self.checked or _is_compiling():
            return self(*args, **{h: features[h] for h in self.hints if h in features})
        if self._per_call is not None:
            self._per_call(args)
        v = variant
        if v is None:
            v, back = self.decision(arch, features, "graph" if capturing() else "eager", strided)
            if back:
                raise BaselineChosen(self.short)
        try:
            return v.fn(*args)
        except Exception as exc:
            self._features_failed(v, arch, features, exc)
            return self.serve_decided(arch, features, strided, args)

    def decision(self, arch: str, features: dict, mode: str, strided: bool) -> tuple:
        """(variant, whether an engine plugin's call goes back to the engine's own kernel: the
        baseline serves it, or its region is handed back) for these shape features in `mode`;
        `strided`: the call passes strided views (a region's strided-capable variant may serve them
        where the baseline would serve contiguous ones). Asked before every plugin call, which
        passes the variant on to `serve_decided`. Remembered per features and forgotten with the
        dispatcher's decisions: the router and the fallback chain cost more than the rest of a
        handed-back call."""
        key = (arch, mode, strided, *features.items())
        hit = self._decisions.get(key)
        if hit is None:
            v = self.choose(arch, features, mode, strided)
            hit = self._decisions[key] = (v, v.baseline or self.hands_back(arch, features, mode))
            if len(self._decisions) > MAX_SEEN_ONCE:
                self._decisions.popitem(last=False)
        return hit

    def reset(self) -> None:
        self._entries.clear()
        self._seen_once.clear()
        self._decisions.clear()
        self._last = None  # the entry of the previous call (a fast path; always guarded)
        self._failed.clear()
        self._copies.clear()

    def _variant_failed(self, e: _Entry, fn, exc: Exception, args):
        """Variant `fn` of entry e raised: the shape goes to the router's next choice in both call
        modes (or the baseline) from now on, and this call is served by it."""
        base = registry.baseline(self.definition, e.arch)
        eager = fn is e.eager_fn
        failed = e.eager if eager else e.variant
        if failed.name.split(CONTIGUOUS_COPIES)[0] == base.name:
            raise exc
        self._failed.add((failed.name.split(CONTIGUOUS_COPIES)[0], e.arch, e.axes))
        self._decisions.clear()  # a shape whose variant failed is decided again
        e.set(self.choose(e.arch, dict(e.axes), strided=e.strided), self.choose(e.arch, dict(e.axes), "eager", e.strided))
        nxt = (e.eager or e.variant) if eager else e.variant
        to_base = nxt.name.split(CONTIGUOUS_COPIES)[0] == base.name
        self._warn_once(("failed", failed.name),
                        f"variant {failed.name!r} raised {type(exc).__name__}: {exc} on {dict(e.axes)}; "
                        f"serving {'the baseline ' if to_base else ''}{nxt.name!r} for this shape from now on")
        try:
            return nxt.fn(*args)
        except Exception as again:
            return self._variant_failed(e, nxt.fn, again, args)

    def _warn_once(self, key, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"kdispatch.ops.{self.short}: {msg}", RuntimeWarning, stacklevel=4)
