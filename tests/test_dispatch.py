"""Dispatch: router -> variant, baseline fallbacks (no router, unsupported shape, unknown name,
exception), signature caching, and that dispatch never reads tensor values (meta tensors)."""
import warnings

import pytest
import torch

import kdispatch
from kdispatch import registry
from kdispatch.registry import Variant
from kdispatch.workloads import materialize

DECODE = "gdn_decode_qk4_v8_d128_k_last"


def decode_args(batch_size, device="cpu", seed=0):
    return materialize(DECODE, {"axes": {"batch_size": batch_size}, "inputs": {}, "uuid": f"t{batch_size}"},
                       device=device, seed=seed)


@pytest.fixture
def fake(request):
    """Registers a fake gdn_decode variant on the CPU and routes every shape to it; undone after."""
    calls = []
    behaviour = {"raise": False, "max_batch": 1 << 30}

    def fn(q, k, v, state, A_log, a, dt_bias, b, scale):
        calls.append(q.shape[0])
        if behaviour["raise"]:
            raise RuntimeError("kernel exploded")
        return torch.full((q.shape[0], 1, 8, 128), 7.0, dtype=torch.bfloat16), state

    registry.discover()
    registry.register(Variant(DECODE, "fake_cpu", fn, "torch", ("cpu", "meta"),
                              supports=lambda f: f["batch_size"] <= behaviour["max_batch"]))
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    d.set_router("cpu", lambda batch_size: "fake_cpu")
    d.set_router("meta", lambda batch_size: "fake_cpu")
    yield calls, behaviour
    d.set_router("cpu", None)
    d.set_router("meta", None)
    registry.unregister(DECODE, "fake_cpu")


def test_no_router_serves_the_reference():
    args = decode_args(2)
    state0 = args[3].clone()
    out, new_state = kdispatch.ops.gdn_decode(*args)
    ref = registry.get(DECODE, "reference")
    assert registry.baseline(DECODE, "cpu") is ref
    args2 = decode_args(2)
    args2[3].copy_(state0)
    out2, _ = ref.fn(*args2)
    assert new_state is args[3], "the op updates the state in place"
    torch.testing.assert_close(out, out2)
    assert not torch.equal(new_state, state0)


def test_router_picks_variant(fake):
    calls, _ = fake
    out, _ = kdispatch.ops.gdn_decode(*decode_args(3))
    assert calls == [3] and torch.all(out == 7)


def test_unsupported_shape_goes_to_baseline(fake):
    calls, behaviour = fake
    behaviour["max_batch"] = 2
    out, _ = kdispatch.ops.gdn_decode(*decode_args(3))
    assert calls == [] and not torch.all(out == 7)
    kdispatch.ops.gdn_decode(*decode_args(2))
    assert calls == [2]


def test_exception_falls_back_once_and_remembers(fake):
    calls, behaviour = fake
    behaviour["raise"] = True
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out, _ = kdispatch.ops.gdn_decode(*decode_args(2))
        out2, _ = kdispatch.ops.gdn_decode(*decode_args(2))
    assert calls == [2], "after failing once the variant is not called again for that shape"
    assert not torch.all(out == 7) and torch.isfinite(out.float()).all()
    assert sum("kernel exploded" in str(x.message) for x in w) == 1, "warns once"
    torch.testing.assert_close(out, out2)


@pytest.fixture
def chain(fake):
    """A second fake variant, `second_cpu`, and a router answering (fake_cpu, second_cpu)."""
    seconds = []

    def fn(q, k, v, state, A_log, a, dt_bias, b, scale):
        seconds.append(q.shape[0])
        return torch.full((q.shape[0], 1, 8, 128), 5.0, dtype=torch.bfloat16), state

    registry.register(Variant(DECODE, "second_cpu", fn, "torch", ("cpu", "meta"),
                              supports=lambda f: f["batch_size"] <= 4))
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    d.set_router("cpu", lambda batch_size: ("fake_cpu", "second_cpu"))
    d._warned.clear()  # warnings are once per process: earlier tests said theirs
    yield (*fake, seconds)
    registry.unregister(DECODE, "second_cpu")


def test_a_declined_shape_goes_to_the_next_variant_of_the_chain(chain):
    calls, behaviour, seconds = chain
    behaviour["max_batch"] = 2
    out, _ = kdispatch.ops.gdn_decode(*decode_args(3))
    assert calls == [] and seconds == [3] and torch.all(out == 5)
    out, _ = kdispatch.ops.gdn_decode(*decode_args(6))  # both decline: the baseline
    assert seconds == [3] and not torch.all(out == 5) and not torch.all(out == 7)
    c = kdispatch.ops.DISPATCHERS["gdn_decode"].explain("cpu", {"batch_size": 6})
    assert c.router_says == "fake_cpu" and len(c.steps) == 2 and "serving the baseline" in c.steps[-1]


def test_a_raising_variant_hands_its_shape_to_the_next_of_the_chain(chain):
    calls, behaviour, seconds = chain
    behaviour["raise"] = True
    with pytest.warns(RuntimeWarning, match="serving 'second_cpu'"):
        out, _ = kdispatch.ops.gdn_decode(*decode_args(2))
    out2, _ = kdispatch.ops.gdn_decode(*decode_args(2))
    assert calls == [2] and seconds == [2, 2] and torch.all(out == 5) and torch.all(out2 == 5)


def test_unknown_variant_name_goes_to_baseline(fake):
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    d.set_router("cpu", lambda batch_size: "no_such_variant")
    with pytest.warns(RuntimeWarning, match="no_such_variant"):
        out, _ = kdispatch.ops.gdn_decode(*decode_args(2))
    assert torch.isfinite(out.float()).all()


def test_dispatch_reads_no_tensor_values(fake):
    """Meta tensors have no data: any .item()/.tolist() in dispatch would raise."""
    calls, _ = fake
    args = [x.to("meta") if isinstance(x, torch.Tensor) else x for x in decode_args(4)]
    kdispatch.ops.gdn_decode(*args)
    kdispatch.ops.gdn_decode(*args)
    assert calls == [4, 4]


def test_guard_revalidates_same_shape_with_other_dtype(fake):
    args = decode_args(2)
    kdispatch.ops.gdn_decode(*args)
    bad = list(args)
    bad[0] = bad[0].float()
    with pytest.raises(ValueError, match="'q'.*bfloat16.*float32"):
        kdispatch.ops.gdn_decode(*bad)


def test_the_last_signature_fast_path_still_guards_every_tensor(fake):
    """The previous call's entry is tried first: alternating signatures are each served by their own
    entry, and a repeat with one later tensor changed (dtype, or None) is validated again."""
    calls, behaviour = fake
    behaviour["max_batch"] = 3  # batch 4 goes to the baseline (the reference)
    small, large = decode_args(2), decode_args(4)
    for args in (small, large, small, large):
        kdispatch.ops.gdn_decode(*args)
    assert calls == [2, 2]
    bad = list(small)
    bad[4] = bad[4].double()  # A_log
    with pytest.raises(ValueError, match="'A_log'"):
        kdispatch.ops.gdn_decode(*bad)
    bad[4] = None
    with pytest.raises(ValueError, match="'A_log'"):
        kdispatch.ops.gdn_decode(*bad)


def test_every_op_runs_on_cpu_through_dispatch():
    """Each op with no router serves the reference and returns the definition's outputs."""
    from kdispatch import definitions

    small = {
        "dsa_topk_indexer": {"batch_size": 2, "max_num_pages": 3, "num_pages": 16},
        "dsa_sparse_attention": {"num_tokens": 2, "num_pages": 8},
        "gdn_prefill": {"total_seq_len": 5, "num_seqs": 2, "len_cu_seqlens": 3},
    }
    for short, axes in small.items():
        args = materialize(short, {"axes": axes, "inputs": {}, "uuid": "cpu-" + short}, device="cpu", seed=1)
        out = getattr(kdispatch.ops, short)(*args)
        outs = out if isinstance(out, tuple) else (out,)
        spec = definitions.load(short)["outputs"]
        assert len(outs) == len(spec)
        for t, (name, s) in zip(outs, spec.items()):
            assert str(t.dtype).endswith(s["dtype"]), (short, name, t.dtype)


def test_capture_counter_follows_cuda_graph_captures(monkeypatch):
    """`capturing()` counts captures begun through torch.cuda.CUDAGraph (the GPU test checks a real
    capture); a capture that fails to begin is not counted, and capture_end always uncounts."""
    import torch

    from kdispatch import dispatch

    if not torch.backends.cuda.is_built():
        pytest.skip("torch without CUDA: nothing to wrap")
    graph = torch.cuda.CUDAGraph
    assert graph.capture_begin._kdispatch_counts and not dispatch.capturing()
    with pytest.raises(Exception):
        graph.capture_begin(object())  # not a graph: the original raises before counting
    assert not dispatch.capturing()
    monkeypatch.setattr(dispatch, "_captures", 1)
    assert dispatch.capturing()
    with pytest.raises(Exception):
        graph.capture_end(object())
    assert not dispatch.capturing()


def test_a_handed_back_region_raises_for_plugins_only(fake):
    """A region the router marks `hand_back` (a variant that beat only the guarded baseline there):
    kdispatch.ops calls take the variant; a plugin's call (handing_back_baseline) is given back, per
    call mode."""
    from kdispatch.dispatch import BaselineChosen, handing_back_baseline

    calls, _ = fake
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    d.set_router("cpu", lambda batch_size: "fake_cpu", hand_back=lambda batch_size: batch_size <= 4)
    kdispatch.ops.gdn_decode(*decode_args(2))
    assert calls == [2]
    with handing_back_baseline():
        with pytest.raises(BaselineChosen):
            kdispatch.ops.gdn_decode(*decode_args(2))
        kdispatch.ops.gdn_decode(*decode_args(8))  # outside the handed-back region: the variant runs
    assert calls == [2, 8]
    # eager calls asked apart: handed back in graph mode only, so an eager plugin call keeps the variant
    d.set_router("cpu", lambda batch_size: "fake_cpu", hand_back=lambda batch_size: True,
                 hand_back_eager=lambda batch_size: False)
    with handing_back_baseline():
        kdispatch.ops.gdn_decode(*decode_args(2))
    assert calls == [2, 8, 2]


def test_a_shape_seen_once_is_decided_once_and_cached_when_seen_again(fake, monkeypatch):
    """A first tensor's shape new to the dispatcher gets a one-off decision (no guard is built: an
    engine's prefill brings a new token count nearly every call); seen again, it is cached."""
    from kdispatch import dispatch

    calls, _ = fake
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    built = []
    monkeypatch.setattr(dispatch, "make_guard", lambda ts, _make=dispatch.make_guard: built.append(1) or _make(ts))
    args = decode_args(3)
    kdispatch.ops.gdn_decode(*args)
    assert calls == [3] and not built and not d._entries
    for _ in range(3):
        kdispatch.ops.gdn_decode(*args)
    assert calls == [3] * 4 and len(built) == 1 and sum(map(len, d._entries.values())) == 1
    bad = list(decode_args(5))
    bad[0] = bad[0].float()
    with pytest.raises(ValueError, match="'q'"):  # a one-off call is checked in full too
        kdispatch.ops.gdn_decode(*bad)


def test_a_handed_back_new_shape_is_given_back_before_any_check(fake):
    """Inside handing_back_baseline a new shape the router gives back raises BaselineChosen without
    being checked (the engine's own kernel serves the engine's call), and costs no cache entry; a
    shape kdispatch serves is still checked."""
    from kdispatch.dispatch import BaselineChosen, handing_back_baseline

    calls, _ = fake
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    d.set_router("cpu", lambda batch_size: "fake_cpu", hand_back=lambda batch_size: batch_size <= 4)
    odd = list(decode_args(2))
    odd[4] = odd[4].double()  # A_log of a dtype no kdispatch kernel takes
    with handing_back_baseline():
        with pytest.raises(BaselineChosen):
            kdispatch.ops.gdn_decode(*odd)
        bad = list(decode_args(8))
        bad[4] = bad[4].double()
        with pytest.raises(ValueError, match="'A_log'"):
            kdispatch.ops.gdn_decode(*bad)
    assert calls == [] and not d._entries


def test_a_plugins_question_is_answered_once_per_shape_until_the_decisions_are_forgotten(fake):
    """`decision` (asked by engine plugins before every call) is remembered per shape and mode, and
    forgotten with the dispatcher's decisions: a new router, a variant that raised."""
    calls, behaviour = fake
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    asked = []
    d.set_router("cpu", lambda batch_size: asked.append(batch_size) or "fake_cpu",
                 hand_back=lambda batch_size: batch_size <= 4)
    assert d.decision("cpu", {"batch_size": 2}, "graph", False)[1]
    assert not d.decision("cpu", {"batch_size": 8}, "graph", False)[1]
    n = len(asked)
    assert d.decision("cpu", {"batch_size": 2}, "graph", False)[1]
    assert not d.decision("cpu", {"batch_size": 8}, "graph", False)[1]
    assert len(asked) == n, "remembered"
    behaviour["raise"] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            kdispatch.ops.gdn_decode(*decode_args(8))
    n = len(asked)
    d.decision("cpu", {"batch_size": 8}, "graph", False)[1]
    assert len(asked) > n, "its variant raised: asked again"
    d.set_router("cpu", lambda batch_size: "fake_cpu")
    assert not d.decision("cpu", {"batch_size": 2}, "graph", False)[1], "a new router: asked again"


def test_a_full_decision_memo_forgets_its_oldest_shapes_first(fake, monkeypatch):
    """A serving engine's prefills bring new shapes without end: the memos stay bounded, dropping the
    oldest decision (asked of the router again when it comes back) and keeping the newest."""
    from kdispatch import dispatch

    monkeypatch.setattr(dispatch, "MAX_SEEN_ONCE", 3)
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    asked = []
    d.set_router("cpu", lambda batch_size: asked.append(batch_size) or "fake_cpu")
    for b in range(1, 6):
        d.decision("cpu", {"batch_size": b}, "graph", False)[1]
    assert len(d._decisions) == 3
    asked.clear()
    d.decision("cpu", {"batch_size": 5}, "graph", False)[1]
    assert asked == [], "the newest kept"
    d.decision("cpu", {"batch_size": 1}, "graph", False)[1]
    assert asked == [1], "the oldest forgotten"
    for b in range(1, 6):
        kdispatch.ops.gdn_decode(*decode_args(b))
    assert len(d._seen_once) == 3 and list(d._seen_once) == [decode_args(b)[0].shape for b in (3, 4, 5)]


POOL = "gdn_prefill_pool_qk4_v8_d128_k_last"


def test_a_call_passing_the_hints_is_routed_with_them():
    """gdn_prefill_pool's max_seq_len: the router's hinted answers for calls that pass it (decided once
    per value and call mode), its plain answers for the others; a bad hint raises."""
    registry.discover()
    served = []
    for name in ("fake_plain", "fake_hinted"):
        registry.register(Variant(POOL, name, lambda *a, name=name: served.append(name) or (a[9], a[5]), "torch",
                                  ("cpu",)))
    d = kdispatch.ops.DISPATCHERS["gdn_prefill_pool_qk4_v8"]
    asked = []
    try:
        d.set_router("cpu", lambda **axes: "fake_plain",
                     route_hinted=lambda max_seq_len, **axes: asked.append(max_seq_len) or
                     ("fake_hinted" if max_seq_len > 4 else "fake_plain"))
        args = materialize(POOL, {"axes": {"total_seq_len": 8, "num_seqs": 2, "num_slots": 3}, "inputs": {},
                                  "uuid": "hinted"})
        call = lambda **hint: kdispatch.ops.gdn_prefill_pool(*args[:9], out=args[9], **hint)  # noqa: E731
        for hint, want in (({}, "fake_plain"), ({"max_seq_len": 6}, "fake_hinted"), ({"max_seq_len": 6}, "fake_hinted"),
                           ({"max_seq_len": 3}, "fake_plain"), ({"max_seq_len": None}, "fake_plain")):
            call(**hint)
            assert served[-1] == want, hint
        assert asked == [6, 3], "one decision per hint value"
        assert d.explain("cpu", {"total_seq_len": 8, "num_seqs": 2, "len_cu_seqlens": 3, "num_slots": 3,
                                 "max_seq_len": 7}).variant.name == "fake_hinted"
        with pytest.raises(TypeError, match="max_len"):
            d(*args, max_len=6)
        for bad in (-1, True, 6.0):
            with pytest.raises(ValueError, match="non-negative"):
                call(max_seq_len=bad)
        d.set_router("cpu", lambda **axes: "fake_plain")  # a router fitted without hints: they are ignored
        call(max_seq_len=6)
        assert served[-1] == "fake_plain"
    finally:
        d.set_router("cpu", None)
        for name in ("fake_plain", "fake_hinted"):
            registry.unregister(POOL, name)


def test_a_plugins_question_and_the_call_that_follows_are_routed_once():
    """A prefill of a new token count: the plugin asks `decision` with the call's features, then
    calls the op with the same features (its first such shape, a one-off decision): the router runs
    once; a call passing strided views is decided apart from a contiguous one."""
    registry.discover()
    served = []
    registry.register(Variant(POOL, "fake_hinted", lambda *a: served.append(1) or (a[9], a[5]), "torch", ("cpu",)))
    d = kdispatch.ops.DISPATCHERS["gdn_prefill_pool_qk4_v8"]
    asked = []
    try:
        d.set_router("cpu", lambda **axes: "fake_hinted", route_hinted=lambda **axes: asked.append(axes) or "fake_hinted")
        args = materialize(POOL, {"axes": {"total_seq_len": 8, "num_seqs": 2, "num_slots": 3}, "inputs": {},
                                  "uuid": "asked-once"})
        features = {"total_seq_len": 8, "num_seqs": 2, "len_cu_seqlens": 3, "num_slots": 3, "max_seq_len": 5}
        assert not d.decision("cpu", features, "eager", False)[1]
        kdispatch.ops.gdn_prefill_pool(*args[:9], out=args[9], max_seq_len=5)
        assert served == [1] and len(asked) == 1, "routed once for the question and the call"
        d.decision("cpu", features, "eager", True)[1]
        assert len(asked) == 2, "strided views: a decision of their own"
    finally:
        d.set_router("cpu", None)
        registry.unregister(POOL, "fake_hinted")


def test_a_hinted_call_whose_variant_raises_goes_to_the_next_in_its_chain():
    """A variant chosen by the hints that raises is marked failed for those features, warned about
    once, and the call (and the next with the same hints) is served by the chain's next variant."""
    registry.discover()
    served = []

    def broken(*a):
        raise RuntimeError("no kernel image")

    registry.register(Variant(POOL, "fake_broken", broken, "torch", ("cpu",)))
    registry.register(Variant(POOL, "fake_ok", lambda *a: served.append("fake_ok") or (a[9], a[5]), "torch", ("cpu",)))
    d = kdispatch.ops.DISPATCHERS["gdn_prefill_pool_qk4_v8"]
    try:
        d.set_router("cpu", lambda **axes: "fake_ok", route_hinted=lambda **axes: ("fake_broken", "fake_ok"))
        args = materialize(POOL, {"axes": {"total_seq_len": 8, "num_seqs": 2, "num_slots": 3}, "inputs": {},
                                  "uuid": "hinted-broken"})
        with pytest.warns(RuntimeWarning, match="fake_broken"):
            kdispatch.ops.gdn_prefill_pool(*args[:9], out=args[9], max_seq_len=6)
        kdispatch.ops.gdn_prefill_pool(*args[:9], out=args[9], max_seq_len=6)
        assert served == ["fake_ok", "fake_ok"]
        assert d._last.hinted["eager"][(6,)][0].name == "fake_ok", "the decision cached for the hint moved on"
    finally:
        d.set_router("cpu", None)
        for name in ("fake_broken", "fake_ok"):
            registry.unregister(POOL, name)


def test_a_plugins_decided_call_is_served_without_validation_and_falls_down_its_chain(monkeypatch):
    """`serve_decided`: the variant `decision` named (passed on, or decided again) serves the
    plugin's call with no signature validated or kept (a new token count costs no more than a
    repeated one); one that raises is marked failed for those features and the next choice
    serves; a region handed back raises BaselineChosen; the checked mode validates as any call does."""
    registry.discover()
    served = []

    def broken(*a):
        raise RuntimeError("no kernel image")

    registry.register(Variant(POOL, "fake_raising", broken, "torch", ("cpu",)))
    registry.register(Variant(POOL, "fake_ok", lambda *a: served.append(a[0].shape[0]) or (a[9], a[5]), "torch",
                              ("cpu",)))
    d = kdispatch.ops.DISPATCHERS["gdn_prefill_pool_qk4_v8"]
    try:
        d.set_router("cpu", lambda **axes: ("fake_raising", "fake_ok"), route_hinted=lambda **axes: "fake_ok",
                     hand_back=lambda **axes: axes["total_seq_len"] > 100)
        args = materialize(POOL, {"axes": {"total_seq_len": 8, "num_seqs": 2, "num_slots": 3}, "inputs": {},
                                  "uuid": "decided"})
        monkeypatch.setattr(d.checker, "check", lambda *a, **k: pytest.fail("a decided call was validated again"))
        for total in (8, 7, 8):
            call = (*(x[:total] for x in args[:5]), *args[5:9], args[9][:total], args[10])
            features = {"total_seq_len": total, "num_seqs": 2, "len_cu_seqlens": 3, "num_slots": 3, "max_seq_len": 5}
            assert not d.decision("cpu", features, "eager", False)[1]
            d.serve_decided("cpu", features, False, call)
        assert served == [8, 7, 8] and not d._entries and not d._seen_once, "no signature kept"
        plain = {"total_seq_len": 8, "num_seqs": 2, "len_cu_seqlens": 3, "num_slots": 3}
        with pytest.warns(RuntimeWarning, match="fake_raising"):
            d.serve_decided("cpu", plain, False, args)
        d.serve_decided("cpu", plain, False, args)
        assert served[3:] == [8, 8], "the chain's next variant serves the features its first raised on"
        with pytest.raises(kdispatch.dispatch.BaselineChosen):
            d.serve_decided("cpu", {**plain, "total_seq_len": 500}, False, args)
        decided, back = d.decision("cpu", plain, "eager", False)
        assert decided.name == "fake_ok" and not back
        monkeypatch.setattr(d, "decision", lambda *a: pytest.fail("a call the plugin decided was routed again"))
        d.serve_decided("cpu", plain, False, args, decided)
        assert served[5:] == [8], "the variant the plugin's decision named serves"
        monkeypatch.undo()
        monkeypatch.setenv("KDISPATCH_CHECK", "1")
        d.reload_switches()
        with pytest.raises(ValueError, match="g"):
            d.serve_decided("cpu", plain, False, (*args[:3], args[3].double(), *args[4:]))
    finally:
        monkeypatch.delenv("KDISPATCH_CHECK", raising=False)
        d.reload_switches()
        d.set_router("cpu", None)
        for name in ("fake_raising", "fake_ok"):
            registry.unregister(POOL, name)


def test_the_contest_prefill_takes_the_hint_too():
    """kdispatch.ops.gdn_prefill(..., max_seq_len=n) is answered by the router's hinted function."""
    registry.discover()
    name = "gdn_prefill_qk4_v8_d128_k_last"
    served = []
    registry.register(Variant(name, "fake_hinted", lambda *a: served.append(a[0].shape[0]) or
                              (torch.zeros(a[0].shape[0], 8, 128, dtype=torch.bfloat16), a[3]), "torch", ("cpu",)))
    d = kdispatch.ops.DISPATCHERS["gdn_prefill"]
    asked = []
    try:
        d.set_router("cpu", lambda **axes: "reference",
                     route_hinted=lambda max_seq_len, **axes: asked.append(max_seq_len) or "fake_hinted")
        args = materialize(name, {"axes": {"total_seq_len": 8, "num_seqs": 2}, "inputs": {}, "uuid": "hint"})
        kdispatch.ops.gdn_prefill(*args, max_seq_len=5)
        assert asked == [5] and served == [8]
        kdispatch.ops.gdn_prefill(*args)
        assert served == [8], "without the hint: the plain answer (the reference)"
    finally:
        d.set_router("cpu", None)
        registry.unregister(name, "fake_hinted")
