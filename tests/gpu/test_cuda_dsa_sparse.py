"""GPU tests of the CUDA split-K sparse attention (kernels/cuda/dsa/sparse_attention_splitk.py).

Every compiled (splits, stages) kernel runs the tuner's correctness gate on contest workloads and a
CUDA-graph replay, and is compared in float64 on crafted index rows: no valid key (zeros, -inf),
one valid key, valid keys only in the last split's slots, out-of-range and negative ids other than
-1, duplicated ids, and logits spread over hundreds (the online softmax and the cross-CTA merge must
rescale without overflow). The caching allocator is filled with NaN before each call, so a slot the
kernel fails to write shows up. Skipped without CUDA.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kdispatch import nvrtc, registry
from kdispatch.tuner import gate
from kdispatch.workloads import load_workloads, materialize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or nvrtc.available() is not None,
                                reason="needs a CUDA device and NVRTC")
TRACES = Path(__file__).resolve().parents[2] / "traces"
SPARSE = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"


def _mod():
    from kdispatch.kernels.cuda.dsa import sparse_attention_splitk as C

    return C


# Every compiled (splits, stages, groups), spelled out: importing the kernel module at collection
# would import Triton before the CPU tests switch on its interpreter (TRITON_INTERPRET).
CONFIGS = ((64, 1, 1), (16, 2, 2), (8, 2, 2), (4, 2, 2), (2, 2, 2), (1, 2, 2))


def _poison():
    junk = torch.full((64 << 20,), float("nan"), device="cuda")  # 256 MiB of NaN for torch.empty to reuse
    del junk


def _ref64(qn, qp, ckv, kpe, idx, scale):
    """float64 sparse attention: (out [T, 16, 512], base-2 lse [T, 16])."""
    ckv2, kpe2 = ckv.reshape(-1, 512).double(), kpe.reshape(-1, 64).double()
    n = ckv2.shape[0]
    T = qn.shape[0]
    out = torch.zeros(T, 16, 512, dtype=torch.float64, device=qn.device)
    lse = torch.full((T, 16), -math.inf, dtype=torch.float64, device=qn.device)
    for t in range(T):
        sel = idx[t].long()
        rows = sel[(sel >= 0) & (sel < n)]
        if rows.numel() == 0:
            continue
        logits = (qn[t].double() @ ckv2[rows].T + qp[t].double() @ kpe2[rows].T) * scale
        lse[t] = torch.logsumexp(logits, dim=-1) / math.log(2)
        out[t] = torch.softmax(logits, dim=-1) @ ckv2[rows]
    return out, lse


def _check(out, lse, ref_out, ref_lse, lse_tol=1e-3):
    assert torch.isfinite(out.float()).all(), "NaN/Inf in output"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), empty), "-inf lse exactly where no key is valid"
    assert not torch.isnan(lse).any()
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[~empty].double(), ref_lse[~empty], atol=lse_tol, rtol=lse_tol)
    assert (out[empty] == 0).all()


def _inputs(T, pages, seed, q_scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qn = (torch.randn(T, 16, 512, device="cuda", generator=g) * q_scale).bfloat16()
    qp = (torch.randn(T, 16, 64, device="cuda", generator=g) * q_scale).bfloat16()
    ckv = torch.randn(pages, 64, 512, device="cuda", generator=g).bfloat16()
    kpe = torch.randn(pages, 64, 64, device="cuda", generator=g).bfloat16()
    n = pages * 64
    idx = torch.stack([torch.randperm(n, device="cuda", generator=g)[:2048] for _ in range(T)]).int()
    return qn, qp, ckv, kpe, idx, 512 ** -0.5


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "ns{}s{}g{}".format(*c))
@pytest.mark.parametrize("workload", [w for w in load_workloads(TRACES, SPARSE)][::6] if TRACES.is_dir() else [],
                         ids=lambda w: f"T{w.axes['num_tokens']}")
def test_gate_and_graph_on_contest_workloads(cfg, workload):
    C = _mod()
    fn = lambda *a: C.dsa_sparse_attention_cuda_splitk(*a, cfg=cfg)  # noqa: E731
    args = list(materialize(SPARSE, workload, device="cuda", seed=3))
    v = gate.run_gate(SPARSE, fn, [(args, gate.reference(SPARSE, args))])
    assert v.passed, f"{cfg} on {dict(workload.axes)}: {v.status}: {v.reason}"
    eager = fn(*args)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = fn(*args)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager[0], atol=0, rtol=0)
    torch.testing.assert_close(lse, eager[1], atol=0, rtol=0)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "ns{}s{}g{}".format(*c))
def test_crafted_index_rows(cfg):
    C = _mod()
    T, pages = 7, 48
    qn, qp, ckv, kpe, idx, scale = _inputs(T, pages, seed=11)
    n = pages * 64
    idx[0] = -1                                  # no valid key
    idx[1] = -1
    idx[1, 1234] = 77                            # a single valid key
    idx[2, :2048 - 2048 // cfg[0]] = -1          # valid keys only in the last split's slots
    idx[3, ::3] = n + 5                          # out of range above
    idx[3, 1::3] = -7                            # negative ids other than -1
    idx[4, 1024:] = idx[4, :1024]                # every id twice
    idx[5, :] = idx[5, :1].expand(2048)          # one id 2048 times
    _poison()
    out, lse = C.dsa_sparse_attention_cuda_splitk(qn, qp, ckv, kpe, idx, scale, cfg=cfg)
    torch.cuda.synchronize()
    _check(out, lse, *_ref64(qn, qp, ckv, kpe, idx, scale))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "ns{}s{}g{}".format(*c))
def test_wide_logits(cfg):
    """Logits spread over hundreds: the running max moves across blocks and CTAs."""
    C = _mod()
    qn, qp, ckv, kpe, idx, scale = _inputs(3, 40, seed=5, q_scale=30.0)
    _poison()
    out, lse = C.dsa_sparse_attention_cuda_splitk(qn, qp, ckv, kpe, idx, scale, cfg=cfg)
    torch.cuda.synchronize()
    _check(out, lse, *_ref64(qn, qp, ckv, kpe, idx, scale), lse_tol=2e-3)


@pytest.mark.parametrize("T", [40, 300])
def test_many_tokens(T):
    """Past the contest's 8 tokens: fewer splits (40 tokens: 4) and one CTA per token writing the
    output directly (300 tokens), against float64."""
    C = _mod()
    assert C.config(T)[0] == (4 if T == 40 else 1)
    qn, qp, ckv, kpe, idx, scale = _inputs(T, 48, seed=T)
    idx[::7, 1000:] = -1  # some tokens with padding
    _poison()
    out, lse = C.dsa_sparse_attention_cuda_splitk(qn, qp, ckv, kpe, idx, scale)
    torch.cuda.synchronize()
    _check(out, lse, *_ref64(qn, qp, ckv, kpe, idx, scale))


def test_rejects_wrong_shapes():
    C = _mod()
    qn, qp, ckv, kpe, idx, scale = _inputs(1, 40, seed=1)
    with pytest.raises(ValueError):
        C.dsa_sparse_attention_cuda_splitk(qn, qp, ckv, kpe, idx[:, :1024], scale)
    with pytest.raises(ValueError):
        C.dsa_sparse_attention_cuda_splitk(qn.float(), qp, ckv, kpe, idx, scale)


def test_every_compiled_config_is_tested():
    assert set(CONFIGS) == set(_mod().CONFIGS)


def test_registered():
    registry.discover()
    v = registry.get("dsa_sparse_attention", "cuda_splitk.s16")
    assert v.backend == "cuda" and any(s.name == "sparse_attention_splitk.cu" for s in v.files)
