"""The shipped definitions: valid FlashInfer-Bench Definitions, equal in every fact (names, axes,
tensor shapes and dtypes, constraints) to the official ones, and carrying the project's reference
module text verbatim.

The official definitions are read from `../shared/fib/definitions` beside the checkout; the
comparison with them is skipped when that folder is absent. Descriptions are our own and are not
compared.
"""
from __future__ import annotations

import pytest

from conftest import official_definition
from kdispatch import definitions

NAMES = definitions.names()


def test_all_five_definitions_ship():
    assert sorted(NAMES) == sorted(definitions.SHORT_NAMES.values())
    for name in NAMES:
        d = definitions.load(name)
        assert d["name"] == name
        assert definitions.path(name).parent.name == d["op_type"]


@pytest.mark.parametrize("name", NAMES)
def test_definition_validates(name):
    pytest.importorskip("flashinfer_bench")
    fib = definitions.as_fib(name)
    assert fib.name == name
    assert fib.reference.strip()


@pytest.mark.parametrize("name", NAMES)
def test_every_tensor_is_described(name):
    d = definitions.load(name)
    for kind in ("inputs", "outputs"):
        for tensor, spec in d[kind].items():
            assert spec.get("description", "").strip(), f"{kind} {tensor} has no description"


@pytest.mark.parametrize("name", NAMES)
def test_reference_text_is_the_module(name):
    assert definitions.load(name)["reference"] == definitions.reference_path(name).read_text()


def _tensor_facts(tensors: dict) -> list:
    """(name, shape, dtype, optional) in definition order: the order is the call signature."""
    return [(n, t.get("shape"), t["dtype"], bool(t.get("optional", False))) for n, t in tensors.items()]


@pytest.mark.parametrize("name", NAMES)
def test_definition_facts_equal_official(name):
    official = official_definition(name)
    ours = definitions.load(name)
    assert ours["name"] == official["name"]
    assert ours["op_type"] == official["op_type"]

    assert list(ours["axes"]) == list(official["axes"])
    for axis, spec in official["axes"].items():
        mine = ours["axes"][axis]
        assert (mine["type"], mine.get("value")) == (spec["type"], spec.get("value")), f"axis {axis}"

    for kind in ("inputs", "outputs"):
        mine, theirs = _tensor_facts(ours[kind]), _tensor_facts(official[kind])
        assert [m[0] for m in mine] == [t[0] for t in theirs], f"{kind}: names or order differ"
        for m, t in zip(mine, theirs):
            assert m == t, f"{kind} {m[0]}: ours {m[1:]} vs official {t[1:]}"

    assert ours.get("constraints", []) == official.get("constraints", [])


@pytest.mark.parametrize("name", NAMES)
def test_validated_models_agree_with_official(name):
    """The same comparison on the pydantic models (what FlashInfer-Bench itself reads)."""
    pytest.importorskip("flashinfer_bench")
    from flashinfer_bench.data import Definition

    official = Definition.model_validate(official_definition(name))
    ours = definitions.as_fib(name)
    strip = {"description"}
    assert {k: v.model_dump(exclude=strip) for k, v in ours.axes.items()} == {
        k: v.model_dump(exclude=strip) for k, v in official.axes.items()}
    for kind in ("inputs", "outputs"):
        assert [(k, v.model_dump(exclude=strip)) for k, v in getattr(ours, kind).items()] == [
            (k, v.model_dump(exclude=strip)) for k, v in getattr(official, kind).items()]
    assert ours.constraints == official.constraints
