"""Operator definitions: FlashInfer-Bench Definition JSON plus one spec each (kdispatch/spec.py).

Layout: `<op_type>/<name>.json` is the single source of truth for an operator's axes, inputs,
outputs and constraints; its `reference` field holds the text of the reference module the spec
names (kept identical by `python -m kdispatch.definitions sync`, checked by the tests). That text
must run on its own wherever FlashInfer-Bench runs it, so a reference imports nothing of kdispatch
and the engine-convention references each spell out the recurrence they share (a common helper
would break the JSON's reference);
`<op_type>/spec.py` defines `SPECS = {json file stem: Spec(...)}` for the definitions of that folder.

    d = definitions.get("gdn_decode")        # short or full name -> Definition
    d.name, d.short, d.inputs, d.var_axes, d.const_axes, d.spec.tolerance("output")

`load(name)` returns the JSON as a plain dict (cached; do not mutate). `add(json_path, spec)`
registers a definition that lives elsewhere (tests, out-of-tree operators). Spec modules import
torch, so they load on first use, not with `import kdispatch`.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kdispatch.spec import Spec

_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, eq=False)
class Definition:
    """A resolved definition: its JSON and its spec."""

    name: str
    path: Path
    data: dict
    spec: Spec

    @property
    def short(self) -> str:
        return self.spec.short

    @property
    def op_type(self) -> str:
        return self.data["op_type"]

    @cached_property
    def inputs(self) -> list[str]:
        return list(self.data["inputs"])

    @cached_property
    def outputs(self) -> list[str]:
        return list(self.data["outputs"])

    @cached_property
    def var_axes(self) -> list[str]:
        """Variable axes in definition order (the routers' parameters)."""
        return [k for k, a in self.data["axes"].items() if a["type"] == "var"]

    @cached_property
    def const_axes(self) -> dict[str, int]:
        return {k: int(a["value"]) for k, a in self.data["axes"].items() if a["type"] == "const"}

    def reference_module(self):
        return importlib.import_module(self.spec.reference)


_BY_NAME: dict[str, Definition] = {}
_discovered = False


def _discover() -> None:
    """Loads every shipped `<op_type>/spec.py` with the JSONs beside it (once)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for folder in sorted(p for p in _HERE.iterdir() if (p / "spec.py").exists()):
        mod = importlib.import_module(f"{__name__}.{folder.name}.spec")
        for stem, spec in mod.SPECS.items():
            add(folder / f"{stem}.json", spec)


def add(json_path: str | Path, spec: Spec) -> Definition:
    """Registers the definition in `json_path` with its spec; returns it. Names must be unique."""
    path = Path(json_path).resolve()
    data = json.loads(path.read_text())
    name = data["name"]
    if path.stem != name:
        raise ValueError(f"{path}: the file must be named after the definition ({name}.json)")
    for other in _BY_NAME.values():
        if other.name != name and other.short == spec.short:
            raise ValueError(f"short name {spec.short!r} of {name} is taken by {other.name}")
    old = _BY_NAME.get(name)
    if old is not None and old.path != path:
        raise ValueError(f"definition {name} is defined twice ({old.path} and {path})")
    d = Definition(name, path, data, spec)
    _BY_NAME[name] = d
    return d


def remove(name: str) -> None:
    """Forgets a definition registered with `add` (tests)."""
    _BY_NAME.pop(resolve_name(name), None)


def get(name) -> Definition:
    """The Definition for a full or short name (or a Definition); ValueError naming the known ones."""
    if isinstance(name, Definition):
        return name
    _discover()
    d = _BY_NAME.get(name)
    if d is None:
        d = next((x for x in _BY_NAME.values() if x.short == name), None)
    if d is None:
        raise ValueError(f"unknown definition {name!r}; known: {sorted(x.short for x in _BY_NAME.values())} "
                         f"or their full names")
    return d


def resolve_name(name: str) -> str:
    """Full definition name for a full or short name."""
    return get(name).name


def names() -> list[str]:
    """Full names of every known definition, sorted."""
    _discover()
    return sorted(_BY_NAME)


def all_definitions() -> list[Definition]:
    return [get(n) for n in names()]


def load(name: str) -> dict:
    """The definition's JSON as a plain dict (do not mutate: it is shared)."""
    return get(name).data



def path(name: str) -> Path:
    return get(name).path


def reference_path(name: str) -> Path:
    """The reference module's file (its text is the definition's `reference`)."""
    spec = importlib.util.find_spec(get(name).spec.reference)
    return Path(spec.origin)


def as_fib(name: str):
    """The definition validated as a `flashinfer_bench.data.Definition`."""
    from flashinfer_bench.data import Definition as FibDefinition

    return FibDefinition.model_validate(load(name))


def __getattr__(attr):  # SHORT_NAMES / FULL_TO_SHORT: computed from the specs on first use
    if attr == "SHORT_NAMES":
        return {get(n).short: n for n in names()}
    if attr == "FULL_TO_SHORT":
        return {n: get(n).short for n in names()}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
