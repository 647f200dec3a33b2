"""The engines' GDN decode convention (gdn_decode_packed_*): its reference agrees with the contest
definition's on the same math, padding rows and foreign slots stay untouched, the op picks the
definition by head count and takes engine layouts (a pool whose slot pitch exceeds a slot, packed
rows with a wider stride), and the checked mode refuses two rows naming one slot."""
import pytest
import torch

import kdispatch
from kdispatch import definitions, registry
from kdispatch.definitions.gdn.names import PACKED_HEADS
from kdispatch.references import gdn_decode as contest
from kdispatch.references import gdn_decode_packed as packed
from kdispatch.workloads import materialize


def packed_args(hq, hv, batch, slots, seed=0):
    w = {"axes": {"batch_size": batch, "num_slots": slots}, "inputs": {}, "uuid": f"packed-{hv}-{batch}"}
    return list(materialize(f"gdn_decode_packed_qk{hq}_v{hv}", w, device="cpu", seed=seed))


def clone(args):
    return [x.clone() if torch.is_tensor(x) else x for x in args]


def test_four_tp_head_counts_are_defined():
    for tp, (hq, hv) in PACKED_HEADS.items():
        d = definitions.get(f"gdn_decode_packed_qk{hq}_v{hv}")
        assert d.const_axes["num_v_heads"] == hv and d.const_axes["qkv_dim"] == (2 * hq + hv) * 128
        assert f"tp:{tp}" in d.data["tags"]


def test_reference_is_the_contest_math_on_normalised_inputs():
    """Unit q/k (what the contest passes) through the packed reference give the contest's results."""
    mixed_qkv, a, b, A_log, dt_bias, pool, idx, out, scale = packed_args(4, 8, 8, 12)
    B = 8
    q = mixed_qkv[:, :512].float().reshape(B, 4, 128)
    k = mixed_qkv[:, 512:1024].float().reshape(B, 4, 128)
    qn = (q / q.norm(dim=-1, keepdim=True)).to(torch.bfloat16)
    kn = (k / k.norm(dim=-1, keepdim=True)).to(torch.bfloat16)
    mixed_qkv = torch.cat([qn.reshape(B, -1), kn.reshape(B, -1), mixed_qkv[:, 1024:]], dim=1)
    live = idx >= 0
    got_out, got_pool = packed.run(mixed_qkv, a, b, A_log, dt_bias, pool, idx, out, scale)
    want_out, want_state = contest.run(qn[:, None], kn[:, None], mixed_qkv[:, 1024:].reshape(B, 1, 8, 128),
                                       pool[idx.clamp_min(0).long()], A_log, a[:, None], dt_bias, b[:, None], scale)
    torch.testing.assert_close(got_out[live], want_out[live], rtol=1e-2, atol=1e-2)
    # q, k renormalised after rounding to bf16: ~1e-3 relative apart
    torch.testing.assert_close(got_pool[idx[live].long()], want_state[live], rtol=1e-3, atol=1e-3)


def test_padding_rows_and_unnamed_slots_are_untouched():
    args = packed_args(2, 4, 16, 20)
    idx = args[6]
    idx[3] = 20  # past the pool: padding too
    out, pool = packed.run(*args)
    live = (idx >= 0) & (idx < 20)
    assert int((~live).sum()) == 3
    assert torch.equal(out[~live].float(), torch.zeros_like(out[~live].float()))
    named = set(idx[live].tolist())
    for s in range(20):
        same = torch.equal(pool[s], args[5][s])
        assert same == (s not in named), s


def test_the_op_takes_engine_layouts_and_picks_the_head_count():
    """A pool view with a slot pitch past the slot (vLLM's cache pages) and packed rows with a wider
    stride: same results as contiguous, the pool's own storage updated."""
    args = packed_args(8, 16, 5, 7)
    want_out, want_pool = kdispatch.ops.gdn_decode_packed(*clone(args))
    mixed, pool = args[0], args[5]
    wide = torch.zeros(5, mixed.shape[1] + 64, dtype=mixed.dtype)
    wide[:, :mixed.shape[1]] = mixed
    slot = pool[0].numel()
    pages = torch.zeros(7, slot + 4096)
    pages[:, :slot] = pool.reshape(7, -1)
    view = pages.as_strided(pool.shape, (slot + 4096, *pool.stride()[1:]))
    args[0], args[5] = wide[:, :mixed.shape[1]], view
    out, new_pool = kdispatch.ops.gdn_decode_packed(*args)
    assert new_pool is view and out is args[7]
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    torch.testing.assert_close(view, want_pool, rtol=0, atol=0)
    assert torch.equal(pages[:, slot:], torch.zeros(7, 4096)), "nothing written between slots"


def test_out_is_optional_and_unknown_head_counts_are_refused():
    args = packed_args(16, 32, 2, 3)
    out, _ = kdispatch.ops.gdn_decode_packed(*args[:7])
    assert out.shape == (2, 1, 32, 128)
    bad = clone(args)
    bad[1], bad[2] = bad[1][:, :12], bad[2][:, :12]
    with pytest.raises(ValueError, match="HV one of"):
        kdispatch.ops.gdn_decode_packed(*bad)


def test_checked_mode_refuses_a_slot_named_twice(monkeypatch):
    monkeypatch.setenv("KDISPATCH_CHECK", "1")
    d = kdispatch.ops.DISPATCHERS["gdn_decode_packed_qk4_v8"]
    d.reload_switches()
    try:
        args = packed_args(4, 8, 4, 6)
        args[6][1] = args[6][0]
        with pytest.raises(ValueError, match="state_indices.*named by 2 rows"):
            kdispatch.ops.gdn_decode_packed(*args)
    finally:
        monkeypatch.delenv("KDISPATCH_CHECK")
        d.reload_switches()


def test_a_strided_pool_reaching_a_contiguous_only_variant_is_copied_back():
    """The dispatcher's contiguous-copies fallback writes an in-place input back into the caller's."""
    name = "gdn_decode_packed_qk4_v8_d128_k_last"
    ref = registry.get(name, "reference")
    registry.register(registry.Variant(name, "contiguous_only", lambda *a: ref.fn(*a), "torch", ("cpu",)))
    d = kdispatch.ops.DISPATCHERS["gdn_decode_packed_qk4_v8"]
    d.set_router("cpu", lambda **axes: "contiguous_only")
    try:
        args = packed_args(4, 8, 3, 5)
        want_out, want_pool = kdispatch.ops.gdn_decode_packed(*clone(args))
        pages = torch.zeros(5, args[5][0].numel() * 2)
        view = pages[:, :args[5][0].numel()].view(args[5].shape)
        view.copy_(args[5])
        args[5] = view
        assert d.explain("cpu", {"batch_size": 3, "num_slots": 5}, strided=True).variant.name.endswith("copies)")
        out, pool = kdispatch.ops.gdn_decode_packed(*args)
        assert pool is view
        torch.testing.assert_close(view, want_pool, rtol=0, atol=0)
        torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    finally:
        d.set_router("cpu", None)
        registry.unregister(name, "contiguous_only")
