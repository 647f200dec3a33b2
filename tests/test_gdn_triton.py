"""CPU tests of the Triton GDN kernels (kernels/triton/gdn/) under the Triton interpreter.

Without a GPU, TRITON_INTERPRET=1 runs the kernels on CPU tensors. The kernels are compared with
kdispatch's references (and, where ../shared/fib is present, the official FlashInfer-Bench ones) on
fresh random inputs: output in bf16 tolerance, new state in fp32 tolerance, the state updated in
place. Shapes are kept small: the interpreter runs each program in Python.
"""
import math

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from conftest import DEVICE as DEV  # noqa: E402
from conftest import kernel_module, official_run  # noqa: E402
from kdispatch.references import gdn_decode as ref_decode  # noqa: E402
from kdispatch.references import gdn_prefill as ref_prefill  # noqa: E402

D = kernel_module("kdispatch.kernels.triton.gdn.decode_splitv")
P = kernel_module("kdispatch.kernels.triton.gdn.prefill_recurrent")
PREFILL_CONFIG = P.prefill_config  # the heuristic itself: conftest widens its blocks under the interpreter
HQK, HV, K, V = 4, 8, 128, 128
SCALE = 1.0 / math.sqrt(K)


# ------------------------------------------------------------------------------------------ inputs
def _unit(*shape, gen):
    return F.normalize(torch.randn(*shape, generator=gen), dim=-1).to(torch.bfloat16).to(DEV)


def _gates(*shape, gen):
    a = (torch.randn(*shape, generator=gen) * 2).to(torch.bfloat16).to(DEV)
    b = (torch.randn(*shape, generator=gen) * 2).to(torch.bfloat16).to(DEV)
    return a, b


def _params(gen):
    A_log = (torch.randn(HV, generator=gen) * 0.5).to(DEV)
    dt_bias = (torch.randn(HV, generator=gen) * 0.5).to(DEV)
    return A_log, dt_bias


def decode_inputs(B, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = _unit(B, 1, HQK, K, gen=g), _unit(B, 1, HQK, K, gen=g)
    v = torch.randn(B, 1, HV, V, generator=g).to(torch.bfloat16).to(DEV)
    state = (torch.randn(B, HV, V, K, generator=g) * 0.1).to(DEV)
    A_log, dt_bias = _params(g)
    a, b = _gates(B, 1, HV, gen=g)
    return [q, k, v, state, A_log, a, dt_bias, b, SCALE]


def prefill_inputs(cu, seed):
    g = torch.Generator().manual_seed(seed)
    T, N = cu[-1], len(cu) - 1
    q, k = _unit(T, HQK, K, gen=g), _unit(T, HQK, K, gen=g)
    v = torch.randn(T, HV, V, generator=g).to(torch.bfloat16).to(DEV)
    state = (torch.randn(N, HV, V, K, generator=g) * 0.1).to(DEV)
    A_log, dt_bias = _params(g)
    a, b = _gates(T, HV, gen=g)
    cu_seqlens = torch.tensor(cu, dtype=torch.int64, device=DEV)
    return [q, k, v, state, A_log, a, dt_bias, b, cu_seqlens, SCALE]


# -------------------------------------------------------------------------------------- comparison
def check_gdn(out, new_state, ref_out, ref_state):
    """Raise AssertionError unless (out, new_state) matches the reference: finite everywhere,
    output within bf16 tolerance, state within fp32 tolerance."""
    assert out.dtype == torch.bfloat16 and out.shape == ref_out.shape, (out.dtype, out.shape)
    assert new_state.dtype == torch.float32 and new_state.shape == ref_state.shape
    assert torch.isfinite(out.float()).all(), "output has NaN/Inf"
    assert torch.isfinite(new_state).all(), "state has NaN/Inf"
    torch.testing.assert_close(out.float().cpu(), ref_out.float().cpu(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(new_state.cpu(), ref_state.float().cpu(), atol=1e-5, rtol=1e-4)


def run_decode(fn, inputs, **kw):
    ref_out, ref_state = ref_decode.run(*inputs)  # the reference never writes `state`
    state = inputs[3]
    out, new_state = fn(*inputs, **kw)
    assert new_state is state, "the new state must be written into `state` in place"
    check_gdn(out, new_state, ref_out, ref_state)


def run_prefill(fn, inputs, **kw):
    ref_out, ref_state = ref_prefill.run(*inputs)
    state = inputs[3]
    out, new_state = fn(*inputs, **kw)
    assert new_state is state, "the new state must be written into `state` in place"
    check_gdn(out, new_state, ref_out, ref_state)


# ------------------------------------------------------------------------------------------ decode
@pytest.mark.parametrize("B", [1, 3])
def test_decode_registered_variant(B):
    run_decode(D.gdn_decode_triton_splitv, decode_inputs(B, seed=B))


@pytest.mark.parametrize("BV,num_warps", [(4, 1), (32, 1), (128, 4)])
def test_decode_block_sizes(BV, num_warps):
    run_decode(D.gdn_decode_splitv, decode_inputs(2, seed=10 + BV), BV=BV, num_warps=num_warps)


def test_decode_strided_inputs_and_default_scale():
    """q/k/v as views into one fused projection (head and batch strides not the packed ones),
    scale 0 -> 1/sqrt(K)."""
    B = 2
    inputs = decode_inputs(B, seed=21)
    fused = torch.randn(B, 1, 2 * HQK + HV, K).to(torch.bfloat16).to(DEV)
    fused[:, :, :HQK] = inputs[0]
    fused[:, :, HQK:2 * HQK] = inputs[1]
    fused[:, :, 2 * HQK:] = inputs[2]
    inputs[:3] = fused[:, :, :HQK], fused[:, :, HQK:2 * HQK], fused[:, :, 2 * HQK:]
    assert not inputs[0].is_contiguous()
    inputs[8] = 0.0
    run_decode(D.gdn_decode_splitv, inputs, BV=64)


def test_decode_config_is_valid():
    for B in list(range(1, 70)) + [128, 256, 1024]:
        bv, nw = D.decode_config(B)
        assert V % bv == 0 and nw in (1, 2, 4, 8, 16)


# ----------------------------------------------------------------------------------------- prefill
@pytest.mark.parametrize("cu", [[0, 1], [0, 3, 4, 9], [0, 7]])
def test_prefill_partitions(cu):
    run_prefill(P.gdn_prefill_recurrent, prefill_inputs(cu, seed=len(cu) + cu[-1]), BV=32)


def test_prefill_registered_variant():
    run_prefill(P.gdn_prefill_triton_recurrent, prefill_inputs([0, 2], seed=5))  # heuristic BV


def test_prefill_empty_sequence_keeps_state():
    inputs = prefill_inputs([0, 2, 2, 4], seed=6)
    before = inputs[3][1].clone()
    run_prefill(P.gdn_prefill_recurrent, inputs, BV=64)
    torch.testing.assert_close(inputs[3][1], before, rtol=0, atol=0)


def test_prefill_strided_inputs():
    cu = [0, 2, 5]
    inputs = prefill_inputs(cu, seed=7)
    fused = torch.randn(cu[-1], 2 * HQK + HV, K).to(torch.bfloat16).to(DEV)
    fused[:, :HQK], fused[:, HQK:2 * HQK], fused[:, 2 * HQK:] = inputs[0], inputs[1], inputs[2]
    inputs[:3] = fused[:, :HQK], fused[:, HQK:2 * HQK], fused[:, 2 * HQK:]
    run_prefill(P.gdn_prefill_recurrent, inputs, BV=64)


def test_prefill_config_is_valid():
    for N in list(range(1, 70)) + [512]:
        bv, nw = PREFILL_CONFIG(N)
        assert V % bv == 0 and nw in (1, 2, 4, 8)


# ------------------------------------------------------------------------ the oracle itself, checked
def test_comparison_rejects_wrong_results():
    inputs = decode_inputs(1, seed=30)
    ref_out, ref_state = ref_decode.run(*inputs)
    check_gdn(ref_out.clone(), ref_state.clone(), ref_out, ref_state)  # identical passes
    bad = ref_out.clone()
    bad[0, 0, 3, 5] += 0.5
    with pytest.raises(AssertionError):
        check_gdn(bad, ref_state.clone(), ref_out, ref_state)
    bad_state = ref_state.clone()
    bad_state[0, 2, 7, 9] *= 1.01
    with pytest.raises(AssertionError):
        check_gdn(ref_out.clone(), bad_state, ref_out, ref_state)
    nan_out = ref_out.clone()
    nan_out[0, 0, 0, 0] = float("nan")
    with pytest.raises(AssertionError):
        check_gdn(nan_out, ref_state.clone(), ref_out, ref_state)
    # A kernel that skipped the gate (g = 1) must fail too.
    no_decay = list(inputs)
    no_decay[4] = torch.full_like(inputs[4], -30.0)  # exp(A_log) ~ 0 -> g = 1
    wrong_out, wrong_state = ref_decode.run(*no_decay)
    with pytest.raises(AssertionError):
        check_gdn(wrong_out, wrong_state, ref_out, ref_state)


# ------------------------------------------------------------- official FlashInfer-Bench references
def test_decode_matches_official_reference():
    run = official_run("gdn_decode")
    inputs = decode_inputs(2, seed=40)
    ref_out, ref_state = run(*inputs)
    out, new_state = D.gdn_decode_splitv(*inputs, BV=64)
    check_gdn(out, new_state, ref_out, ref_state)


def test_prefill_matches_official_reference():
    run = official_run("gdn_prefill")
    inputs = prefill_inputs([0, 1, 4], seed=41)
    ref_out, ref_state = run(*inputs)
    out, new_state = P.gdn_prefill_recurrent(*inputs, BV=64)
    check_gdn(out, new_state, ref_out, ref_state)
