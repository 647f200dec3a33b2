"""vLLM's prefill convention on the GPU (gdn_prefill_gathered_*): vLLM's FlashInfer call (the baseline,
guarded) and the pool kernels serving it through identity slots, against the reference; a malformed
cu_seqlens (zero output, states unchanged); inside a CUDA graph. Skipped without CUDA."""
import pytest
import torch

from engine_pool import args_for as _args_for
from engine_pool import check_prefill as check
from engine_pool import reference as _reference
from engine_pool import runnable as _runnable
from kdispatch.definitions.gdn.gathered import GATHERED_HEADS, gathered_prefill_name

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

HEADS = list(GATHERED_HEADS.values())
VARIANTS = ["vllm_flashinfer_prefill", "triton_prefill_fused.c16v64", "triton_prefill_staged.c16v64",
            "cuda_prefill_staged.r32s4", "cuda_prefill_cp.p4", "triton_prefill_chunked.v64",
            "cuda_prefill_pool_rows.k2c8", "flashinfer_direct"]
OUT, STATES, CU = 7, 5, 6


def args_for(hq, hv, total, seqs, seed=0):
    return _args_for(gathered_prefill_name(hq, hv), {"total_seq_len": total, "num_seqs": seqs}, seed)


def reference(hq, hv, args):
    return _reference(gathered_prefill_name(hq, hv), args)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("hq,hv", HEADS)
@pytest.mark.parametrize("total,seqs", [(1, 1), (37, 3), (700, 40), (4096, 2)])
def test_against_the_reference(hq, hv, total, seqs, name):
    v = _runnable(gathered_prefill_name(hq, hv), name)
    args = args_for(hq, hv, total, seqs, seed=total)
    if seqs >= 3:  # an empty sequence keeps its state
        args[CU][2] = args[CU][1]
    want = reference(hq, hv, args)
    got = v.fn(*args)
    assert got[0] is args[OUT] and got[1] is args[STATES], "output and final states in place"
    check(got, want)


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("hq,hv", HEADS)
def test_views_of_a_projection_row(hq, hv, name):
    """q/k/v split out of one row, as vLLM passes them, read in place by a variant declaring `strided`
    (a variant that does not is served on copies by the dispatcher)."""
    v = _runnable(gathered_prefill_name(hq, hv), name)
    if not v.strided:
        pytest.skip(f"{name} takes contiguous q/k/v (the dispatcher copies views for it)")
    args = args_for(hq, hv, 700, 40, seed=11)
    total, width = args[0].shape[0], (2 * hq + hv) * 128
    row = torch.empty(total, width, dtype=torch.bfloat16, device=args[0].device)
    bounds = ((0, hq * 128), (hq * 128, 2 * hq * 128), (2 * hq * 128, width))
    for i, (a, b) in enumerate(bounds):
        row[:, a:b] = args[i].reshape(total, -1)
        args[i] = row[:, a:b].view(total, -1, 128)
    assert not args[2].is_contiguous()
    want = reference(hq, hv, args)
    args[OUT].fill_(float("nan"))  # every row must be written
    check(v.fn(*args), want)


@pytest.mark.parametrize("name", VARIANTS)
def test_malformed_cu_seqlens_is_a_no_op(name):
    v = _runnable(gathered_prefill_name(4, 8), name)
    args = args_for(4, 8, 120, 6, seed=5)
    args[CU][3] = args[CU][2] - 1
    before = args[STATES].clone()
    out, states = v.fn(*args)
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(states, before)


@pytest.mark.parametrize("name", VARIANTS)
def test_in_a_graph(name):
    hq, hv = 16, 32
    v = _runnable(gathered_prefill_name(hq, hv), name)
    args = args_for(hq, hv, 512, 9)
    want = reference(hq, hv, args)
    work = [x.clone() if torch.is_tensor(x) else x for x in args]
    v.fn(*[x.clone() if torch.is_tensor(x) else x for x in args])  # compile outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = v.fn(*work)
    for i in (OUT, STATES):
        work[i].copy_(args[i])
    g.replay()
    check(got, want, states=work[STATES])
