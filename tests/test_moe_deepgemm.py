"""The DeepGEMM MoE variants' glue (kernels/library/moe/deepgemm.py: torch ops; deepgemm_fused.py: Triton
kernels) on the CPU, against stand-ins for DeepGEMM 2.6.1's grouped GEMMs that keep their contracts:
FP8 K-major operands with per-row, 128-column and [G, N / 128, K / 128] fp32 scales, a bf16 output;
contiguous: int32 m_indices whose every expert run starts at a multiple of 128 rows, or the psum
layout (per expert the end row of its run, runs starting at the previous end rounded up to 128),
padding rows left as garbage (NaN here); masked: [G, M, K] buffers, int32 per-expert row counts,
rows past them read as garbage and written as NaN. Sizes and the float64 expected value:
tests/moe_small.py (the routing at full size, 32 local experts)."""
import functools
import sys
import types

import pytest
import torch

pytest.importorskip("triton")

import moe_small  # noqa: E402
from conftest import INTERPRETED  # noqa: E402

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="the stand-in replaces DeepGEMM on the CPU only")


def _dequant(x, scale, rows_block):
    r, c = x.shape[-2:]
    s = scale.repeat_interleave(rows_block, dim=-2)[..., :r, :].repeat_interleave(128, dim=-1)[..., :c]
    return x.double() * s.double()


def _fake_deep_gemm(calls):
    def m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout, use_psum_layout=False,
                                         expected_m_for_psum_layout=None):
        (x, xs), (w, ws) = a, b
        m, k = x.shape
        g, n, _ = w.shape
        assert x.dtype == w.dtype == torch.float8_e4m3fn and x.stride(-1) == 1 and w.is_contiguous()
        assert xs.shape == (m, k // 128) and ws.shape == (g, n // 128, k // 128) and xs.dtype == torch.float32
        assert d.shape == (m, n) and d.dtype == torch.bfloat16 and grouped_layout.dtype == torch.int32
        assert m % 128 == 0 and grouped_layout.is_contiguous()
        if use_psum_layout:  # per group the end row of its run; a run starts at the previous end rounded up to 128
            assert grouped_layout.shape == (g,) and isinstance(expected_m_for_psum_layout, int)
            assert expected_m_for_psum_layout > 0
            m_indices = torch.full((m,), -1, dtype=torch.int32)
            start = 0
            for e, end in enumerate(grouped_layout.tolist()):
                assert start <= end <= m, (e, start, end)
                m_indices[start:end] = e
                start = -(-end // 128) * 128
        else:
            m_indices = grouped_layout
            assert m_indices.shape == (m,) and expected_m_for_psum_layout is None
            starts = torch.nonzero((m_indices[1:] != m_indices[:-1]) & (m_indices[1:] >= 0)).flatten() + 1
            assert (starts % 128 == 0).all(), "an expert's rows must start at a multiple of 128"
        assert int(m_indices.max()) < g
        xd = _dequant(x, xs, 1)
        d.fill_(float("nan"))  # what padding rows may hold
        for e in range(g):
            rows = m_indices == e
            if rows.any():
                d[rows] = (xd[rows] @ _dequant(w[e], ws[e], 128).t()).to(torch.bfloat16)
        calls.append((m, xs.stride() == (1, m)))  # the rows, and whether the scales came MN-major

    def m_grouped_fp8_gemm_nt_masked(a, b, d, masked_m, expected_m):
        (x, xs), (w, ws) = a, b
        g, m, k = x.shape
        _, n, _ = w.shape
        assert x.dtype == w.dtype == torch.float8_e4m3fn and x.is_contiguous() and w.is_contiguous()
        assert xs.shape == (g, m, k // 128) and ws.shape == (g, n // 128, k // 128) and xs.dtype == torch.float32
        assert d.shape == (g, m, n) and d.dtype == torch.bfloat16 and d.is_contiguous()
        assert masked_m.shape == (g,) and masked_m.dtype == torch.int32 and masked_m.is_contiguous()
        assert isinstance(expected_m, int) and expected_m > 0 and m % 128 == 0
        assert bool(((masked_m >= 0) & (masked_m <= m)).all())
        d.fill_(float("nan"))  # rows past an expert's count are garbage
        for e in range(g):
            r = int(masked_m[e])
            if r:  # only the counted rows are read: the rest of the buffer may hold anything
                d[e, :r] = (_dequant(x[e, :r], xs[e, :r], 1) @ _dequant(w[e], ws[e], 128).t()).to(torch.bfloat16)
        calls.append((m, False))

    return types.SimpleNamespace(m_grouped_fp8_gemm_nt_contiguous=m_grouped_fp8_gemm_nt_contiguous,
                                 m_grouped_fp8_gemm_nt_masked=m_grouped_fp8_gemm_nt_masked)


@pytest.fixture(params=["contiguous", "masked", "fused-counted", "fused-bound"])
def peer(monkeypatch, request):
    calls = []
    monkeypatch.setitem(sys.modules, "deep_gemm", _fake_deep_gemm(calls))
    from kdispatch.kernels.library.moe import deepgemm, deepgemm_fused
    fn = {"contiguous": deepgemm.moe_fp8_deepgemm, "masked": deepgemm.moe_fp8_deepgemm_masked,
          "fused-counted": functools.partial(deepgemm_fused.moe_fp8_deepgemm_fused, bound=False),
          "fused-bound": functools.partial(deepgemm_fused.moe_fp8_deepgemm_fused, bound=True)}[request.param]
    if request.param.startswith("fused"):  # fresh buffers poisoned: a kernel may read only what one wrote
        empty = torch.empty

        def poisoned(*args, **kwargs):
            t = empty(*args, **kwargs)
            if t.dtype == torch.float8_e4m3fn:
                t.view(torch.uint8).fill_(0x7F)  # NaN
            elif t.is_floating_point():
                t.fill_(float("nan"))
            elif t.dtype != torch.bool:
                t.fill_(torch.iinfo(t.dtype).max)
            return t

        monkeypatch.setattr(torch, "empty", poisoned)
    return fn, calls, request.param


@pytest.mark.parametrize("T,offset", [(1, 0), (6, 64), (23, 224)])
def test_peer_matches_the_dense_formula(peer, T, offset):
    fn, calls, layout = peer
    args = moe_small.inputs(T, seed=T, offset=offset)
    want = moe_small.expected(*args)
    out = fn(*args)
    assert out.dtype == torch.bfloat16 and out.shape == want.shape and torch.isfinite(out.float()).all()
    got = out.double()
    # the SwiGLU output is re-quantised to FP8 between the GEMMs, as in SGLang's pipeline
    torch.testing.assert_close(got, want, atol=6e-2, rtol=6e-2)
    assert (got - want).norm() <= 0.04 * want.norm() + 1e-9
    # the counted contiguous layouts are sized from the routed rows: none routed here, no GEMM
    assert len(calls) == (0 if layout in ("contiguous", "fused-counted") and not want.any() else 2)
    if layout.startswith("fused"):  # DeepGEMM's sm_90 layout: it would transpose any other, a launch a GEMM
        assert all(mn_major for _, mn_major in calls)


def test_no_local_expert_gives_zeros(peer):
    fn, _, _ = peer
    args = moe_small.inputs(4, seed=3)
    args[8] = 1000
    assert (fn(*args) == 0).all()


@pytest.mark.parametrize("T,offset", [(1, 0), (23, 224), (40, 64)])
def test_psum_ends_each_run_at_its_last_routed_row(T, offset):
    """deepgemm_fused_bound's DeepGEMM layout: expert e's run ends at its start plus its routed rows
    (not at its padded end), an expert without rows at the previous end rounded up to 128."""
    from kdispatch.kernels.library.moe import deepgemm_fused as F
    from kdispatch.kernels.triton.moe.fp8_grouped import _fused_route_layout

    logits, bias, *_ = moe_small.inputs(T, seed=T, offset=offset)
    _, row_pair, block_expert = _fused_route_layout(logits, bias, offset, 2.5, moe_small.LOCAL, F.BLOCK_M)
    psum = torch.empty(moe_small.LOCAL, dtype=torch.int32)
    F._psum_kernel[(moe_small.LOCAL,)](row_pair, block_expert, psum, block_expert.numel(), moe_small.LOCAL,
                                        F.BLOCK_M, F.PSUM_CHUNK)
    owner = block_expert.repeat_interleave(F.BLOCK_M)
    start = 0
    for e in range(moe_small.LOCAL):
        rows = torch.nonzero((owner == e) & (row_pair >= 0)).flatten()
        want = start + rows.numel()
        if rows.numel():
            assert int(rows[0]) == start and int(rows[-1]) == want - 1  # the routed rows lead the run
        assert int(psum[e]) == want, e
        start = -(-want // F.BLOCK_M) * F.BLOCK_M
