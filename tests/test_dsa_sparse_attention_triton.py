"""CPU tests of the Triton split-K DSA sparse attention (kernels/triton/dsa/sparse_attention_splitk.py)
under the Triton interpreter.

TRITON_INTERPRET=1 runs the kernels on CPU tensors (tl.dot operands cast to fp32, see the kernel's
docstring). Compared with kdispatch's reference on inputs from `kdispatch.workloads.materialize` and on
handcrafted index rows (all -1, scattered -1, a single valid index): output in bf16 tolerance, base-2
lse in fp32 tolerance, no NaN/Inf except the -inf lse of a row without a valid index. Shapes are small
(few pages, few tokens, small split counts): the interpreter runs each program in Python.
"""
import math

import pytest
import torch

pytest.importorskip("triton")

from conftest import DEVICE as DEV  # noqa: E402
from conftest import kernel_module  # noqa: E402
from kdispatch import registry, workloads  # noqa: E402

_MOD = "kdispatch.kernels.triton.dsa.sparse_attention_splitk"
DEF = "dsa_sparse_attention"


S = kernel_module(_MOD)
OUT_TOL = dict(atol=2e-2, rtol=2e-2)
LSE_TOL = dict(atol=1e-3, rtol=1e-3)


def _reference():
    registry.discover()
    return registry.get(DEF, "reference").fn


def _inputs(T, P, seed, uuid="dsa-splitk-test"):
    args = workloads.materialize(DEF, {"axes": {"num_tokens": T, "num_pages": P}, "inputs": {},
                                       "uuid": uuid}, device=DEV, seed=seed)
    return list(args)


def _check(out, lse, ref_out, ref_lse, empty_rows=()):
    """Raises AssertionError when (out, lse) disagree with the reference."""
    assert out.dtype == torch.bfloat16 and out.shape == ref_out.shape
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
    assert torch.isfinite(out.float()).all(), "NaN/Inf in output"
    empty = torch.zeros(lse.shape[0], dtype=torch.bool)
    empty[list(empty_rows)] = True
    assert torch.isfinite(lse[~empty]).all(), "NaN/Inf in lse of a row with valid indices"
    if empty.any():
        assert (lse[empty] == float("-inf")).all(), "empty row: lse must be -inf"
        assert (out[empty] == 0).all(), "empty row: output must be zeros"
    torch.testing.assert_close(out.float(), ref_out.float(), **OUT_TOL)
    torch.testing.assert_close(lse, ref_lse, **LSE_TOL)  # -inf == -inf passes


def _empty_rows(idx):
    return tuple(int(t) for t in torch.nonzero((idx < 0).all(dim=1)).flatten())


@pytest.mark.parametrize("T,P,seed,cfg", [
    (1, 40, 0, {}),  # the default launch config (BLOCK_N 32, NSPLIT 32: 2 blocks per split)
    (3, 40, 1, dict(NSPLIT=4, BLOCK_N=64)),  # several blocks per split (online softmax across blocks)
    (3, 36, 2, dict(NSPLIT=8, BLOCK_N=32)),
    (2, 36, 3, dict(NSPLIT=1, BLOCK_N=64)),  # one split: what many tokens get (merge of one partial)
])
def test_splitk_matches_reference_on_materialized_inputs(T, P, seed, cfg):
    args = _inputs(T, P, seed)
    ref_out, ref_lse = _reference()(*args)
    out, lse = S.dsa_sparse_attention_splitk(*args, **cfg)
    _check(out, lse, ref_out, ref_lse, _empty_rows(args[4]))


def test_splitk_handcrafted_rows():
    """Row 0 all -1, row 1 scattered -1 (whole splits empty, others partly), row 2 one valid index
    (in the last split), row 3 a full row for contrast."""
    T, P, topk = 4, 40, 2048
    args = _inputs(T, P, seed=3)
    g = torch.Generator().manual_seed(7)
    n_tok = P * 64
    idx = torch.full((T, topk), -1, dtype=torch.int32)
    row1 = torch.randperm(n_tok, generator=g)[:topk].to(torch.int32)
    row1[torch.rand(topk, generator=g) < 0.6] = -1
    row1[256:768] = -1  # whole splits of 256 slots without a valid index
    idx[1] = row1
    idx[2, topk - 5] = 1234
    idx[3] = torch.randperm(n_tok, generator=g)[:topk].to(torch.int32)
    args[4] = idx.to(DEV)
    ref_out, ref_lse = _reference()(*args)
    out, lse = S.dsa_sparse_attention_splitk(*args, NSPLIT=8, BLOCK_N=64)
    _check(out, lse, ref_out, ref_lse, empty_rows=(0,))
    # single valid key: softmax weight 1, output = that ckv row, lse = its base-2 logit
    ckv = args[2].reshape(-1, 512)[1234].float()
    kpe = args[3].reshape(-1, 64)[1234].float()
    logit = (args[0][2].float() @ ckv + args[1][2].float() @ kpe) * args[5]
    torch.testing.assert_close(out[2].float(), ckv.expand(16, 512), **OUT_TOL)
    torch.testing.assert_close(lse[2], logit / math.log(2.0), **LSE_TOL)


def test_splitk_perturbed_output_fails_the_check():
    args = _inputs(2, 40, seed=4)
    ref_out, ref_lse = _reference()(*args)
    out, lse = S.dsa_sparse_attention_splitk(*args, NSPLIT=4, BLOCK_N=64)
    _check(out, lse, ref_out, ref_lse, _empty_rows(args[4]))
    bad = out.clone()
    bad[0, 3, 17] += 0.25
    with pytest.raises(AssertionError):
        _check(bad, lse, ref_out, ref_lse, _empty_rows(args[4]))
    bad_lse = lse.clone()
    bad_lse[1, 5] += 0.1
    with pytest.raises(AssertionError):
        _check(out, bad_lse, ref_out, ref_lse, _empty_rows(args[4]))


def test_splitk_config_bounds_the_workspace():
    """Any token count gets a valid launch and at most 256 (split, token) programs past 4 tokens:
    the fp32 workspace (32 KiB each) stays within 8 MiB."""
    for t in list(range(1, 300)) + [1000, 4096, 65536]:
        bn, ns, nw = S.splitk_config(t)
        assert 2048 % (bn * ns) == 0 and ns & (ns - 1) == 0 and nw in (4, 8)
        assert t <= 4 or ns * t <= 256 or ns == 1
    assert S.splitk_config(8)[1] == 16 and S.splitk_config(4096)[1] == 1


def test_splitk_zero_tokens_and_registration():
    args = _inputs(1, 8, seed=5)
    args[0], args[1], args[4] = args[0][:0], args[1][:0], args[4][:0]
    out, lse = S.dsa_sparse_attention_splitk(*args)
    assert out.shape == (0, 16, 512) and lse.shape == (0, 16)
    registry.discover()
    v = registry.get(DEF, "triton_splitk.b64s16")
    assert v.backend == "triton" and v.archs == ("sm90",) and v.config == dict(BLOCK_N=64, NSPLIT=16)
    assert v.declines({"num_tokens": 64}) is None and "workspace" in v.declines({"num_tokens": 65})
    assert registry.get(DEF, "triton_splitk.b64s1").declines({"num_tokens": 8192}) is None
