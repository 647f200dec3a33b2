"""Whether kdispatch should take an engine's call at all on a device: only where what it would run
is a kernel, i.e. the definition has a router for the device's architecture or a baseline that runs
there (else the dispatcher would serve the torch reference, far slower than the engine's own
kernel, and the plugins leave the call to the engine). Decided once per (definition, device); a
call kdispatch took that raised goes to the engine's kernel, and so does every later one of that
definition on that device (`attempt`), with one logged warning.
"""
from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

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
        from kdispatch import arch, registry

        d = kdispatch.ops.DISPATCHERS[short]
        here = arch.arch_of(device)
        routed = d.router(here) is not None or registry.baseline(d.definition, here).name != registry.REFERENCE
        _decided[key] = None if routed else f"{short}: no router and no runnable baseline on {here}"
    return _decided[key]


def attempt(stats: dict, short: str, device, serve, engine):
    """serve() (kdispatch), counted in `stats`; if it raises, engine() (the engine's own kernel) for
    this call and every later one of `short` on `device`."""
    try:
        result = serve()
    except Exception as exc:
        _decided[(short, device)] = f"{short}: raised {type(exc).__name__}: {exc}"
        logger.warning("kdispatch: %s raised %s: %s; the engine's kernel serves it from now on", short,
                       type(exc).__name__, exc)
        stats["passed"] += 1
        stats["first_pass_reason"] = stats["first_pass_reason"] or _decided[(short, device)]
        return engine()
    stats["served"] += 1
    return result
