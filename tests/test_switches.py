"""Run-time switches: KDISPATCH_DISABLE serves the baseline everywhere, KDISPATCH_FORCE_<OP> forces a
variant (with a warning, once, where it cannot serve), and `Dispatcher.explain` says what a call runs."""
import warnings

import pytest
import torch

import kdispatch
from kdispatch import registry
from kdispatch.registry import Variant
from kdispatch.workloads import materialize

CALLS = []


def _fake(q, k, v, state, A_log, a, dt_bias, b, scale):
    CALLS.append(q.shape[0])
    return torch.full((q.shape[0], 1, 8, 128), 7.0, dtype=torch.bfloat16), state


@pytest.fixture
def op(monkeypatch):
    """gdn_decode on the CPU with a fake variant that takes batches up to 4, routed everywhere."""
    CALLS.clear()
    registry.discover()
    registry.register(Variant("gdn_decode", "fake_small", _fake, "torch", ("cpu",),
                              supports=lambda f: None if f["batch_size"] <= 4 else "only batches up to 4"))
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]

    def switch(**env):
        for k in ("KDISPATCH_DISABLE", "KDISPATCH_FORCE_GDN_DECODE"):
            monkeypatch.delenv(k, raising=False)
        for k, val in env.items():
            monkeypatch.setenv(k, val)
        d.reload_switches()
        d._warned.clear()

    d.set_router("cpu", lambda batch_size: "fake_small")
    switch()
    yield d, switch
    for k in ("KDISPATCH_DISABLE", "KDISPATCH_FORCE_GDN_DECODE"):
        monkeypatch.delenv(k, raising=False)
    d.reload_switches()
    d.set_router("cpu", None)
    registry.unregister("gdn_decode", "fake_small")


def call(batch):
    args = materialize("gdn_decode", {"uuid": f"sw{batch}", "axes": {"batch_size": batch}})
    out, _ = kdispatch.ops.gdn_decode(*args)
    return out


def test_router_choice_without_switches(op):
    assert bool((call(2) == 7).all()) and CALLS == [2]


def test_disable_serves_the_baseline(op):
    d, switch = op
    switch(KDISPATCH_DISABLE="1")
    assert not bool((call(2) == 7).all()) and CALLS == []
    c = d.explain("cpu", {"batch_size": 2})
    assert c.variant.name == "reference" and "KDISPATCH_DISABLE" in c.steps[0]


def test_force_routes_every_supported_shape(op):
    d, switch = op
    d.set_router("cpu", lambda batch_size: "reference")
    switch(KDISPATCH_FORCE_GDN_DECODE="fake_small")
    assert bool((call(3) == 7).all()) and CALLS == [3]


def test_force_of_an_unknown_variant_warns_once_and_serves_the_baseline(op):
    _, switch = op
    switch(KDISPATCH_FORCE_GDN_DECODE="no_such_kernel")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(2)
        call(3)
    said = [str(w.message) for w in caught if "KDISPATCH_FORCE_GDN_DECODE" in str(w.message)]
    assert len(said) == 1 and "unknown variant 'no_such_kernel'" in said[0] and "fake_small" in said[0]
    assert CALLS == []


def test_force_of_a_declining_variant_falls_back_with_the_reason(op):
    d, switch = op
    switch(KDISPATCH_FORCE_GDN_DECODE="fake_small")
    with pytest.warns(RuntimeWarning, match="only batches up to 4"):
        out = call(6)
    assert not bool((out == 7).all()) and CALLS == []
    c = d.explain("cpu", {"batch_size": 6})
    assert c.variant.name == "reference" and "only batches up to 4" in c.steps[0]


def test_explain_agrees_with_the_call(op):
    d, _ = op
    for batch in (2, 6):
        CALLS.clear()
        served = d.explain("cpu", {"batch_size": batch}).variant.name
        call(batch)
        assert (served == "fake_small") == (CALLS == [batch])
    assert d.explain("cpu", {"batch_size": 6}).router_says == "fake_small"
