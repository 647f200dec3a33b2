"""The plugins take an engine's call only where kdispatch has a router for the device's architecture
(a tune measured its variants against the engine's kernel there); else the dispatcher would serve
its baseline, the torch reference or the engine's own kernel behind a guard, and the call stays the
engine's."""
import torch

from kdispatch.integrations import serving
from kdispatch.ops import DISPATCHERS


def test_no_kernel_here_means_the_engine_keeps_the_call(monkeypatch):
    monkeypatch.setattr(serving, "_decided", {})
    for kind in ("decode_packed", "prefill_pool", "verify", "verify_steps"):
        why = serving.not_served(serving.gdn_short(kind, 8), torch.device("cpu"))
        assert why is not None and "no router for cpu" in why, kind


def test_a_runnable_baseline_without_a_router_leaves_the_call_to_the_engine(monkeypatch):
    """The baseline is the engine's own kernel behind kdispatch's guard: no faster than the engine's call."""
    from kdispatch import registry

    monkeypatch.setattr(serving, "_decided", {})
    d = DISPATCHERS["gdn_verify_qk4_v8"]
    engine_kernel = registry.Variant(d.definition, "engine_kernel", lambda *a: None, "library", ("cpu",), baseline=True)
    monkeypatch.setattr(registry, "baseline", lambda definition, arch: engine_kernel)
    monkeypatch.setitem(d._routers, "cpu", None)
    why = serving.not_served("gdn_verify_qk4_v8", torch.device("cpu"))
    assert why is not None and "no router for cpu" in why


def test_a_router_fitted_against_an_engine_kernel_means_kdispatch_serves(monkeypatch):
    """...and one fitted against the torch reference does not: the engine's kernel was never measured."""
    from kdispatch import registry

    d = DISPATCHERS["gdn_verify_steps_qk4_v8"]
    monkeypatch.setitem(d._routers, "cpu", {"graph": lambda **axes: "reference", "eager": lambda **axes: "reference"})
    monkeypatch.setattr(serving, "_decided", {})
    why = serving.not_served("gdn_verify_steps_qk4_v8", torch.device("cpu"))
    assert why is not None and "fitted against the torch reference" in why
    engine_kernel = registry.Variant(d.definition, "engine_kernel", lambda *a: None, "library", ("cpu",), baseline=True)
    monkeypatch.setattr(registry, "baseline", lambda definition, arch: engine_kernel)
    monkeypatch.setattr(serving, "_decided", {})
    assert serving.not_served("gdn_verify_steps_qk4_v8", torch.device("cpu")) is None


def test_a_call_that_raises_goes_to_the_engine_from_then_on(monkeypatch):
    monkeypatch.setattr(serving, "_decided", {("gdn_verify_qk4_v8", "cuda:0"): None})
    stats = {"served": 0, "passed": 0, "first_pass_reason": None}

    def broken():
        raise RuntimeError("no kernel image")

    assert serving.attempt(stats, "gdn_verify_qk4_v8", "cuda:0", broken, lambda: "engine") == "engine"
    assert stats["passed"] == 1 and "no kernel image" in stats["first_pass_reason"]
    assert "raised RuntimeError" in serving.not_served("gdn_verify_qk4_v8", "cuda:0")
    assert serving.attempt(stats, "gdn_verify_qk4_v8", "cuda:0", lambda: "kdispatch", lambda: "engine") == "kdispatch"
    assert stats["served"] == 1


def test_layer_parameters_are_converted_per_tensor_and_version():
    """A_log / dt_bias in bf16 go to float32 once per tensor; a parameter written in place, or a new
    tensor at a dead one's address, is converted again (a stale copy would silently change the gates)."""
    from kdispatch.integrations.packed_decode import as_fp32

    a = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    first = as_fp32(a)
    assert as_fp32(a) is first and first.tolist() == [1.0, 2.0]
    a.add_(1)
    assert as_fp32(a).tolist() == [2.0, 3.0]
    for value in (5.0, 7.0):  # fresh tensors, often at the same address
        assert as_fp32(torch.full((2,), value, dtype=torch.bfloat16)).tolist() == [value, value]


def test_a_parameter_first_converted_during_capture_is_not_kept(monkeypatch):
    """Under CUDA-graph capture the conversion is a captured kernel whose output exists only on replay:
    it is used for that call but not cached; a conversion cached before capture is reused in it."""
    from kdispatch import dispatch
    from kdispatch.integrations.packed_decode import as_fp32

    a = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    monkeypatch.setattr(dispatch, "_captures", 1)
    during = as_fp32(a)
    assert during.tolist() == [1.0, 2.0] and as_fp32(a) is not during
    monkeypatch.setattr(dispatch, "_captures", 0)
    kept = as_fp32(a)
    assert kept is not during and as_fp32(a) is kept
    monkeypatch.setattr(dispatch, "_captures", 1)
    assert as_fp32(a) is kept


def test_a_call_routed_to_the_baseline_goes_to_the_engines_kernel(monkeypatch):
    """Inside attempt(), a shape the router sends to the baseline runs the engine's own call (nothing of
    kdispatch's runs); one sent to a variant runs kdispatch's; outside attempt() the baseline runs."""
    from kdispatch import registry
    from kdispatch.dispatch import _Entry

    d = DISPATCHERS["gdn_verify_steps_qk4_v8"]
    ran = []
    base = registry.Variant(d.definition, "engine_kernel", lambda *a: ran.append("baseline"), "library", ("*",),
                            baseline=True)
    ours = registry.Variant(d.definition, "ours", lambda *a: ran.append("ours"), "triton", ("*",))
    args = tuple(torch.zeros(1) for _ in range(13))

    def routed_to(variant):
        d.reset()
        monkeypatch.setattr(d, "_new_signature", lambda _args, _hinted=False: _Entry(lambda *ts: False, variant, variant, (), "cpu"))

    for chosen, want in ((base, "engine"), (ours, "kdispatch")):
        routed_to(chosen)
        ran.clear()
        stats = {"served": 0, "passed": 0, "first_pass_reason": None}
        assert serving.attempt(stats, d.short, "cuda:0", lambda: d(*args) or "kdispatch", lambda: "engine") == want
        assert ran == ([] if chosen is base else ["ours"])
        assert stats["passed" if chosen is base else "served"] == 1
        assert ("routed to the baseline" in (stats["first_pass_reason"] or "")) == (chosen is base)
    routed_to(base)
    ran.clear()
    d(*args)
    assert ran == ["baseline"]
    d.reset()
