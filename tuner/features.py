"""Shape features of a definition: its variable axes plus the derived integers its spec declares.

A derived feature (`Spec.derived`) is a Python expression over the definition's axes (variable and
constant; no tensor values, no imports), so the router compiler can paste it verbatim into the
generated router, and the fitter evaluates exactly the same expression on every workload's axes.
`Spec.fit` names the features the region fitter may split on, in tie-breaking order; variable axes
missing from it are pool sizes or redundant: they do not change what a kernel costs, and a
threshold on them would only fit noise.
"""
from __future__ import annotations

import ast

from kdispatch import definitions

_BUILTINS = {"max": max, "min": min, "abs": abs}


def var_axes(definition: str) -> list[str]:
    """The definition's variable axes in definition order (the router's parameters)."""
    return definitions.get(definition).var_axes


def fit_names(definition: str) -> tuple[str, ...]:
    return definitions.get(definition).spec.fit


def main(definition: str) -> str:
    return definitions.get(definition).spec.main


def compute(definition: str, axes: dict) -> dict[str, int]:
    """Every feature (variable axes, then derived ones) of one shape, as ints (predicates as 0/1)."""
    d = definitions.get(definition)
    out = {k: int(axes[k]) for k in d.var_axes if k in axes}
    scope = {**d.const_axes, **out}
    for name, der in d.spec.derived.items():
        out[name] = scope[name] = int(eval(der.expr, {"__builtins__": _BUILTINS}, scope))  # the spec's expressions
    return out


def is_bool(definition: str, feature: str) -> bool:
    der = definitions.get(definition).spec.derived.get(feature)
    return bool(der and der.is_bool)


def constants_used(definition: str, features) -> dict[str, int]:
    """The constant axes that the given derived features' expressions refer to (routers bind them)."""
    d = definitions.get(definition)
    used = set()
    for f in features:
        used |= {n.id for n in ast.walk(ast.parse(d.spec.derived[f].expr, mode="eval")) if isinstance(n, ast.Name)}
    return {k: v for k, v in d.const_axes.items() if k in used}
