"""Whether kdispatch should take an engine's call at all on a device: only where the definition has
a router for the device's architecture and its baseline there is an engine's kernel, i.e. where a
tune measured kdispatch's variants against that kernel (vLLM's verify contract, whose baseline is
still the reference, stays vLLM's). Without one the dispatcher would serve its baseline: the torch reference
(far slower than the engine's own kernel), or the engine's kernel itself behind kdispatch's index
guard (one more launch and more host time than the engine's call: SGLang's verify measured 0.65x
in graphs, H100, 2026-11-25); either way the plugins leave the call to the engine. Decided once per
(definition, device). Where there is a router, a call it sends to the baseline (the shapes where
the engine's kernel measured fastest) also goes to the engine's own kernel, called as the engine
calls it (`attempt`, through dispatch.handing_back_baseline). A call kdispatch took that raised goes
to the engine's kernel, and so does every later one of that definition on that device, with one
logged warning.
"""
from __future__ import annotations

import logging

from kdispatch import dispatch
from kdispatch.definitions.gdn.names import PACKED_HEADS

logger = logging.getLogger(__name__)

HEADS = tuple(sorted(hv for _, hv in PACKED_HEADS.values()))  # value heads of the GDN engine definitions

_decided: dict = {}  # (definition short name, device) -> None or why not


def gdn_short(kind: str, value_heads: int) -> str:
    """The engine-convention GDN definition of `kind` ("decode_packed", "prefill_pool", "verify",
    "verify_steps") for a rank with `value_heads` value heads (half as many q/k heads)."""
    return f"gdn_{kind}_qk{value_heads // 2}_v{value_heads}"


def not_served(short: str, device) -> str | None:
    """None where kdispatch runs a kernel for `short` on `device`, else why not."""
    key = (short, device)
    if key not in _decided:
        import kdispatch.ops
        from kdispatch import arch

        from kdispatch import registry

        here = arch.arch_of(device)
        d = kdispatch.ops.DISPATCHERS[short]
        if d.router(here) is None:
            _decided[key] = f"{short}: no router for {here} (the engine's kernel serves)"
        elif registry.baseline(d.definition, here).name == registry.REFERENCE:
            _decided[key] = (f"{short}: its router on {here} was fitted against the torch reference, not an "
                             "engine's kernel (the engine's kernel serves)")
        else:
            _decided[key] = None
    return _decided[key]


def strided_views(*tensors) -> bool:
    """Is any of these (the inputs a definition takes as views) not contiguous?"""
    for t in tensors:
        if not t.is_contiguous():
            return True
    return False


# asked on every engine call: looked up once (the imports alone cost a handed-back call ~1 us)
_dispatchers: dict = {}  # definition short name -> its kdispatch.ops dispatcher
_archs: dict = {}  # device -> its architecture


def _dispatcher(short: str):
    import kdispatch.ops

    return _dispatchers.setdefault(short, kdispatch.ops.DISPATCHERS[short])


def _arch(device) -> str:
    from kdispatch import arch

    return _archs.setdefault(device, arch.arch_of(device))


def decision(short: str, value_heads: int, device, axes, strided: bool = False) -> tuple | None:
    """The router's decision for a plugin call of `short` (`Dispatcher.decision`, in this call's mode):
    (variant, whether the engine's kernel gets the call back: its baseline's region, or one it hands
    back), or None where kdispatch does not serve the call's head count or `short` on this device
    (the call's own checks then say why). Asked before the call's arguments are built, so that a
    call given back costs the engine a few microseconds of host time, not the views, buffers and
    checks of a kdispatch call. `axes()`: the definition's variable axes of the call, built only
    when asked; `strided`: `strided_views` of the call's tensors the definition takes as views (its
    spec's `strided` inputs). A plugin that serves the call passes the variant on to
    `serve_decided`, so the call is routed once."""
    if value_heads not in HEADS or not_served(short, device) is not None:
        return None
    d = _dispatchers.get(short) or _dispatcher(short)
    here = _archs.get(device) or _arch(device)
    return d.decision(here, axes(), "graph" if dispatch.capturing() else "eager", strided)


def given_back(short: str, value_heads: int, device, axes, strided: bool = False) -> bool:
    """Does `decision` give the call back to the engine's kernel (False where kdispatch does not
    serve it at all)?"""
    decided = decision(short, value_heads, device, axes, strided)
    return decided is not None and decided[1]


def serve_decided(short: str, device, axes: dict, strided: bool, args: tuple, variant=None):
    """The call `decision` (or `given_back`) has just decided with `axes` and `strided` (`variant`:
    the variant `decision` named), whose layout and counts the plugin has checked
    (`layout_not_covered` and its own count comparisons), served by the decision's variant
    (`Dispatcher.serve_decided`): what a prefill of a new token count costs no more than a
    repeated one. `args`: the definition's inputs in order."""
    d = _dispatchers.get(short) or _dispatcher(short)
    return d.serve_decided(_archs.get(device) or _arch(device), axes, strided, args, variant)


def layout_not_covered(key: tuple, tensors: tuple, check) -> str | None:
    """`check()`: why kdispatch's definitions do not cover a call (None: they do), from each of its
    tensors' dtype, rank, strides and sizes after the first dimension (the first: a batch's tokens,
    requests or slots, which change from call to call; the caller compares them across tensors on
    every call). Asked on every call of every layer: a layout found covered under `key` (the call's
    other facts) is remembered by a guard on `tensors` (~0.5 us against a few us of checks)."""
    guards = _covered_layouts.get(key, ())
    for guard in guards:
        if guard(*tensors):
            return None
    why = check()
    if why is None:
        _covered_layouts[key] = (dispatch.make_guard(tensors, open_first=True), *guards)[:MAX_LAYOUTS]
    return why


_covered_layouts: dict = {}  # key -> guards of call layouts found covered, newest first
MAX_LAYOUTS = 8  # a serving loop's batch sizes come and go: the newest few are kept


def passed(stats: dict, why: str) -> None:
    """Counts a call a plugin passed to the engine in `stats`, keeping the first reason."""
    stats["passed"] += 1
    stats["first_pass_reason"] = stats["first_pass_reason"] or why


def attempt(stats: dict, short: str, device, serve, engine):
    """serve() (kdispatch), counted in `stats`; engine() (the engine's own kernel) where the router
    sends the call to the baseline, and if serve() raises, for this call and every later one of
    `short` on `device`."""
    try:
        with dispatch.handing_back_baseline():
            result = serve()
    except dispatch.BaselineChosen:
        passed(stats, f"{short}: routed to the baseline for this shape")
        return engine()
    except Exception as exc:
        _decided[(short, device)] = f"{short}: raised {type(exc).__name__}: {exc}"
        logger.warning("kdispatch: %s raised %s: %s; the engine's kernel serves it from now on", short,
                       type(exc).__name__, exc)
        passed(stats, _decided[(short, device)])
        return engine()
    stats["served"] += 1
    return result
