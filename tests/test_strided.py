"""Strided inputs: the ops accept views whose last dimension is contiguous where the spec allows them
(q/k/v/a/b split out of one packed projection, as engines do), give the same results as on
contiguous copies, and the dispatcher sends a strided call to a variant that reads strides, else to
its first choice on contiguous copies."""
import warnings

import pytest
import torch

import kdispatch
from kdispatch import registry
from kdispatch.registry import Variant
from kdispatch.workloads import materialize

DECODE = "gdn_decode_qk4_v8_d128_k_last"


def decode_args(batch, seed=0):
    return list(materialize(DECODE, {"axes": {"batch_size": batch}, "inputs": {}, "uuid": f"strided{batch}"},
                            device="cpu", seed=seed))


def packed_decode_args(batch, seed=0):
    """The same values with q, k, v and a, b as views into packed rows (mixed_qkv, ba), as engines
    pass them."""
    args = decode_args(batch, seed)
    q, k, v, state, A_log, a, dt_bias, b, scale = args
    mixed = torch.cat([q.reshape(batch, -1), k.reshape(batch, -1), v.reshape(batch, -1)], dim=1)
    ba = torch.cat([b.reshape(batch, -1), a.reshape(batch, -1), torch.zeros(batch, 3, dtype=a.dtype)], dim=1)
    views = (mixed[:, :512].view(batch, 1, 4, 128), mixed[:, 512:1024].view(batch, 1, 4, 128),
             mixed[:, 1024:].view(batch, 1, 8, 128), ba[:, 8:16].view(batch, 1, 8), ba[:, :8].view(batch, 1, 8))
    assert not any(x.is_contiguous() for x in views)
    pq, pk, pv, pa, pb = views
    return [pq, pk, pv, state, A_log, pa, dt_bias, pb, scale]


def test_views_with_contiguous_rows_give_the_contiguous_results():
    want_out, want_state = kdispatch.ops.gdn_decode(*decode_args(3))
    got_out, got_state = kdispatch.ops.gdn_decode(*packed_decode_args(3))
    torch.testing.assert_close(got_out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(got_state, want_state, rtol=0, atol=0)


def test_prefill_takes_a_split_qkv():
    w = {"axes": {"total_seq_len": 11, "num_seqs": 2}, "inputs": {}, "uuid": "strided-prefill"}
    args = list(materialize("gdn_prefill", w, device="cpu"))
    want_out, want_state = kdispatch.ops.gdn_prefill(*[x.clone() if torch.is_tensor(x) else x for x in args])
    q, k, v = args[:3]
    mixed = torch.cat([q.reshape(11, -1), k.reshape(11, -1), v.reshape(11, -1)], dim=1)
    args[:3] = mixed[:, :512].view(11, 4, 128), mixed[:, 512:1024].view(11, 4, 128), mixed[:, 1024:].view(11, 8, 128)
    got_out, got_state = kdispatch.ops.gdn_prefill(*args)
    torch.testing.assert_close(got_out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(got_state, want_state, rtol=0, atol=0)


def test_a_strided_last_dimension_or_a_strided_state_is_refused():
    args = decode_args(2)
    bad = list(args)
    bad[0] = torch.zeros(2, 1, 4, 256, dtype=torch.bfloat16)[..., ::2]
    with pytest.raises(ValueError, match="'q'.*last dimension is contiguous"):
        kdispatch.ops.gdn_decode(*bad)
    bad = list(args)
    bad[3] = torch.zeros(2, 8, 128, 256)[..., :128]
    with pytest.raises(ValueError, match="'state' expected a contiguous tensor, got strides"):
        kdispatch.ops.gdn_decode(*bad)


@pytest.fixture
def layout_variants():
    """Two CPU variants of gdn_decode: one that reads strides, one that refuses anything else than
    contiguous inputs (raising, as a kernel indexing by shape would read wrong values)."""
    seen = []

    def contiguous_only(*args):
        assert all(x.is_contiguous() for x in args if torch.is_tensor(x)), "handed a strided view"
        seen.append("contiguous_only")
        return torch.zeros(args[0].shape[0], 1, 8, 128, dtype=torch.bfloat16), args[3]

    def reads_strides(*args):
        seen.append("reads_strides")
        return torch.zeros(args[0].shape[0], 1, 8, 128, dtype=torch.bfloat16), args[3]

    registry.discover()
    registry.register(Variant(DECODE, "contiguous_only", contiguous_only, "torch", ("cpu",)))
    registry.register(Variant(DECODE, "reads_strides", reads_strides, "torch", ("cpu",), strided=True))
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    yield d, seen
    d.set_router("cpu", None)
    registry.unregister(DECODE, "contiguous_only")
    registry.unregister(DECODE, "reads_strides")


def test_a_strided_call_goes_to_the_first_choice_that_reads_strides(layout_variants):
    d, seen = layout_variants
    d.set_router("cpu", lambda **axes: ("contiguous_only", "reads_strides"))
    kdispatch.ops.gdn_decode(*decode_args(2))
    kdispatch.ops.gdn_decode(*packed_decode_args(2))
    assert seen == ["contiguous_only", "reads_strides"]
    c = d.explain("cpu", {"batch_size": 2}, strided=True)
    assert c.variant.name == "reads_strides" and "takes contiguous inputs only" in c.steps[0]


def test_without_a_strided_choice_the_first_one_runs_on_contiguous_copies(layout_variants):
    d, seen = layout_variants
    d.set_router("cpu", lambda **axes: ("contiguous_only",))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no variant raises: the copies reach it contiguous
        kdispatch.ops.gdn_decode(*packed_decode_args(4))
    assert seen == ["contiguous_only"]
    c = d.explain("cpu", {"batch_size": 4}, strided=True)
    assert c.variant.name == "contiguous_only" + kdispatch.dispatch.CONTIGUOUS_COPIES
    assert d.explain("cpu", {"batch_size": 4}).variant.name == "contiguous_only"


def test_a_copies_choice_that_raises_falls_back_to_the_baseline_once(layout_variants):
    d, seen = layout_variants

    def explodes(*args):
        raise RuntimeError("kernel exploded")

    registry.register(Variant(DECODE, "explodes", explodes, "torch", ("cpu",)))
    try:
        d.set_router("cpu", lambda **axes: ("explodes",))
        args = packed_decode_args(2)
        want = registry.get(DECODE, "reference").fn(*decode_args(2))
        with pytest.warns(RuntimeWarning, match="explodes"):
            out, _ = kdispatch.ops.gdn_decode(*args)
        torch.testing.assert_close(out, want[0], rtol=0, atol=0)
    finally:
        registry.unregister(DECODE, "explodes")


def test_gathered_prefill_variants_read_views_as_their_pool_forms_do():
    """A gathered-prefill variant is its pool form called with identity slots: where the pool form
    reads q/k/v views, so must the gathered one declare it, or vLLM's calls (v split out of its
    projection row) pass over the router's choice for the next variant that does (the staged path's
    regions went to `flashinfer_direct`, H200, 2026-12-01)."""
    from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, gathered_prefill_name
    from kdispatch.definitions.gdn.names import pool_prefill_name

    checked = 0
    for hq, hv in GATHERED_HEADS.values():
        pool = {v.name: v.strided for v in registry.variants(pool_prefill_name(hq, hv))}
        for v in registry.variants(gathered_prefill_name(hq, hv)):
            if pool.get(v.name):
                assert v.strided, f"{v.definition}: {v.name} reads views in the pool convention, not here"
                checked += 1
    assert checked >= 5 * len(GATHERED_HEADS)
