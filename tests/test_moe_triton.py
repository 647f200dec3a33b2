"""CPU tests of the Triton grouped FP8 MoE (kernels/triton/moe/fp8_grouped.py) under the interpreter.

The kernels take their sizes from the tensors, so the tests shrink hidden (7168 -> 256) and
intermediate (2048 -> 128) sizes and keep the routing (256 experts, 8 groups, top 8) and the 32 local
experts; a float64 dense computation of the reference's formula is the expected value. Also the
fused routing and expert-sorted layout on their own, against the reference's routing and a torch
layout (`torch_layout`, the test's oracle).
"""
import pytest
import torch

pytest.importorskip("triton")

import moe_small  # noqa: E402
from conftest import kernel_module  # noqa: E402
from kdispatch import registry  # noqa: E402

_MOD = "kdispatch.kernels.triton.moe.fp8_grouped"


M = kernel_module(_MOD)
HIDDEN, LOCAL = moe_small.HIDDEN, moe_small.LOCAL
_inputs, _expected = moe_small.inputs, moe_small.expected


@pytest.fixture
def poisoned_buffers(monkeypatch):
    """torch.empty filled with NaN (fp32) or 5: what a kernel reads before it writes shows."""
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *s, dtype=None, device=None: empty(*s, dtype=dtype, device=device)
                        .fill_(float("nan") if dtype in (None, torch.float32) else 5))


def _check(out, want):
    assert out.dtype == torch.bfloat16 and out.shape == want.shape
    assert torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.double(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("T,seed,name,inter", [(1, 0, "triton_grouped_m16.fr", 128), (6, 1, "triton_grouped_m16.fr", 128),
                                               (5, 2, "triton_grouped_m64.fr", 128), (9, 5, "triton_grouped_m32.fr", 128),
                                               (7, 3, "triton_grouped_m32q.fr", 256), (4, 4, "triton_grouped_m64q.fr", 128)])
def test_grouped_matches_dense_formula(T, seed, name, inter, poisoned_buffers):
    """(an intermediate size of 256 gives the FP8 intermediate two scale blocks per row; the fp32
    output the routing kernel zeroes comes poisoned)"""
    args = _inputs(T, seed, inter=inter)
    want = _expected(*args, fp8_down=M.CONFIGS[name].get("fp8_y", False))
    assert want.abs().max() > 0.1, "test inputs must route some tokens to this rank"
    _check(M.moe_fp8_grouped(*args, **M.CONFIGS[name]), want)


def test_no_local_expert_gives_zeros_and_perturbation_fails():
    args = _inputs(4, 3, offset=64)
    args[8] = 1000  # no global expert id lands on this rank
    out = M.moe_fp8_grouped(*args, **M.CONFIGS["triton_grouped_m16.fr"])
    assert (out == 0).all()
    args = _inputs(4, 4)
    want = _expected(*args)
    out = M.moe_fp8_grouped(*args, **M.CONFIGS["triton_grouped_m16.fr"])
    _check(out, want)
    bad = out.clone()
    row, col = divmod(int(want.abs().argmax()), HIDDEN)
    bad[row, col] += 0.5
    with pytest.raises(AssertionError):
        _check(bad, want)


def torch_layout(local: torch.Tensor, num_local: int, block_m: int):
    """The expert-sorted, BLOCK_M-padded layout in torch: row_pair [rows] (pair id, -1 = padding) and
    block_expert [rows / block_m] (num_local past the last expert's rows); pairs in id order within
    an expert's run. local: [T, TOP_K] local expert ids, num_local = another rank's expert."""
    flat = local.reshape(-1)
    rows = -(-(flat.numel() + num_local * (block_m - 1)) // block_m) * block_m
    counts = torch.bincount(flat, minlength=num_local + 1)[:num_local]
    pad_end = ((counts + block_m - 1) // block_m * block_m).cumsum(0)
    row_pair = torch.full((rows,), -1, dtype=torch.int32)
    for e in range(num_local):
        pairs = torch.nonzero(flat == e).flatten()
        start = int(pad_end[e]) - int((counts[e] + block_m - 1) // block_m * block_m)
        row_pair[start:start + pairs.numel()] = pairs.to(torch.int32)
    block_expert = torch.searchsorted(pad_end, torch.arange(0, rows, block_m), right=True).to(torch.int32)
    return row_pair, block_expert


def test_the_torch_layout_oracle_places_every_local_pair_once():
    g = torch.Generator().manual_seed(9)
    local = torch.randint(0, LOCAL + 1, (37, 8), generator=g)  # LOCAL = not on this rank
    for block_m in (16, 64):
        row_pair, block_expert = torch_layout(local, LOCAL, block_m)
        assert row_pair.numel() % block_m == 0 and block_expert.numel() == row_pair.numel() // block_m
        placed = row_pair[row_pair >= 0].long()
        want = torch.nonzero(local.reshape(-1) < LOCAL).flatten()
        assert torch.equal(placed.sort().values, want)
        row_expert = block_expert.long().repeat_interleave(block_m)
        assert torch.equal(row_expert[row_pair >= 0], local.reshape(-1)[placed])
        # blocks in expert order, each expert's run starts a fresh block
        assert torch.all(block_expert[1:] >= block_expert[:-1])


def test_registered_variants():
    registry.discover()
    for name in M.CONFIGS:
        v = registry.get("moe_fp8", name)
        assert v.backend == "triton" and v.archs == ("sm90",)


@pytest.mark.parametrize("T,offset", [(1, 0), (37, 64), (130, 224), (300, 32)])
def test_fused_routing_matches_the_reference_and_the_torch_layout(T, offset, monkeypatch):
    """_fused_route_layout: the reference's experts and weights, every local pair once in its
    expert's padded run, block_expert as the torch layout has it (only the order inside a run may
    differ). Its buffers come poisoned (a plausible pair id, NaN), so anything left unset shows."""
    empty = torch.empty

    def poisoned(*shape, dtype=None, device=None):
        buf = empty(*shape, dtype=dtype, device=device)
        return buf.fill_(float("nan") if buf.is_floating_point() else 7)

    monkeypatch.setattr(torch, "empty", poisoned)
    g = torch.Generator().manual_seed(T)
    logits = torch.randn(T, 256, generator=g)
    bias = (0.02 * torch.randn(256, generator=g)).to(torch.bfloat16)
    experts, weights = M.ref._route(logits, bias, 2.5)
    local = experts - offset
    local = torch.where((local >= 0) & (local < LOCAL), local, LOCAL)
    # 1: the DeepGEMM masked variant's layout, a row per pair; 300 tokens (~17 s an interpreted call)
    # skip the 16-row blocks the smaller counts cover
    for block_m in (1, 64) if T > 256 else (1, 16, 64):
        want_pairs, want_blocks = torch_layout(local, LOCAL, block_m)
        pair_weights, row_pair, block_expert = M._fused_route_layout(logits, bias, offset, 2.5, LOCAL, block_m)
        torch.testing.assert_close(pair_weights, weights.reshape(-1), rtol=1e-6, atol=1e-7)
        assert torch.equal(block_expert, want_blocks)
        assert torch.equal(row_pair >= 0, want_pairs >= 0)
        row_expert = block_expert.long().repeat_interleave(block_m)
        placed = row_pair[row_pair >= 0].long()
        assert torch.equal(placed.sort().values, want_pairs[want_pairs >= 0].long().sort().values)
        assert torch.equal(row_expert[row_pair >= 0], local.reshape(-1)[placed])


DECODE = kernel_module("kdispatch.kernels.triton.moe.fp8_decode")


@pytest.mark.parametrize("T,seed,label,inter", [(1, 0, "n32s8", 128), (6, 1, "n64s4q", 256), (32, 6, "n128s8", 128),
                                                (3, 2, "n128s8q", 128), (5, 7, "n64s4qc", 256),
                                                (12, 4, "n128s4q", 256), (9, 8, "n64s4qf", 256),
                                                (2, 10, "n128s8qf", 128), (7, 11, "n128s8ql", 256)])
def test_decode_matches_dense_formula(T, seed, label, inter, poisoned_buffers):
    """The decode kernels (a split of 8 is ragged over the small tests' 2 hidden blocks:
    empty splits must add nothing; an intermediate size of 256 gives the FP8 down projection two
    scale blocks); their workspace comes poisoned, the accumulators and counters the routing kernel
    zeroes included."""
    args = _inputs(T, seed, inter=inter)
    want = _expected(*args, fp8_down=DECODE.CONFIGS[label].get("fp8_down", False))
    assert want.abs().max() > 0.1, "test inputs must route some tokens to this rank"
    _check(DECODE.moe_fp8_decode(*args, **DECODE.CONFIGS[label]), want)


@pytest.mark.parametrize("ahead", [True, False])
def test_decode_scales_loaded_ahead_or_late_over_several_steps(ahead, poisoned_buffers):
    """Unsplit K (the registered splits leave the small tests one step a program): each program walks
    both hidden and both intermediate blocks, so a scale taken from the wrong step shows."""
    args = _inputs(5, 12, inter=256)
    config = dict(DECODE.CONFIGS["n128s4q"], split_k=1, split_k2=1, scales_ahead=ahead)
    _check(DECODE.moe_fp8_decode(*args, **config), _expected(*args, fp8_down=True))


def test_decode_refuses_what_it_cannot_hold(poisoned_buffers):
    """(and with no local expert hit writes zeros: its output comes poisoned)"""
    registry.discover()
    v = registry.get("moe_fp8", "triton_decode.n32s8")
    assert v.declines({"seq_len": DECODE.MAX_TOKENS}) is None
    assert "more than" in v.declines({"seq_len": DECODE.MAX_TOKENS + 1})
    with pytest.raises(ValueError, match="at most"):
        DECODE.moe_fp8_decode(*_inputs(DECODE.MAX_TOKENS + 1, 0), **DECODE.CONFIGS["n32s8"])
    args = _inputs(4, 3, offset=64)
    args[8] = 1000  # no global expert id lands on this rank
    for label in ("n64s4", "n64s4qc", "n128s4qf"):
        assert (DECODE.moe_fp8_decode(*args, **DECODE.CONFIGS[label]) == 0).all()


def test_host_side_cdiv_and_next_pow2_match_tritons():
    import triton

    assert all(M.next_pow2(n) == triton.next_power_of_2(n) for n in range(1, 5000))
    assert all(M.cdiv(a, b) == triton.cdiv(a, b) for a in range(200) for b in range(1, 40))
