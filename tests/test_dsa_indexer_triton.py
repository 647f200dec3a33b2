"""CPU tests of the Triton FP8 indexer (kernels/triton/dsa/indexer_fp8.py) under the interpreter.

Scores against the reference's scoring of every token; selections (radix select and torch.topk)
through the tuner's correctness gate, i.e. FlashInfer-Bench's indexer semantics: min(2048, seq_len)
reachable ids, no duplicates, -1 padding, sorted scores equal to the reference's top scores. Ties
at the k-th score and an empty sequence are covered by handcrafted inputs.
"""
import pytest
import torch

pytest.importorskip("triton")

from conftest import INDEXER, indexer_args, indexer_verdict, kernel_module  # noqa: E402
from kdispatch import registry  # noqa: E402
from kdispatch.definitions.dsa_paged import spec as dsa_spec  # noqa: E402

_MOD = "kdispatch.kernels.triton.dsa.indexer_fp8"


X = kernel_module(_MOD)
SELECTORS = {"radix": X.indexer_radix, "torch_topk": X.indexer_torch_topk}


def test_scores_match_reference_scoring():
    args = indexer_args(3, 36, seed=0)
    scores = X.score_pages(*args)
    want, _ = dsa_spec.indexer_scores(*args)
    live = torch.isfinite(want)
    assert live.sum() > 0
    torch.testing.assert_close(scores[live], want[live], rtol=1e-4, atol=1e-4 * float(want[live].abs().max()))


@pytest.mark.parametrize("selector", sorted(SELECTORS))
@pytest.mark.parametrize("batch,max_pages,seed", [(2, 40, 1), (3, 33, 2), (2, 5, 3)])
def test_selection_passes_the_gate(selector, batch, max_pages, seed):
    args = indexer_args(batch, max_pages, seed)
    out = SELECTORS[selector](*args)
    assert out.dtype == torch.int32 and out.shape == (batch, 2048)
    v = indexer_verdict(args, out)
    assert v.passed, v.message


@pytest.mark.parametrize("selector", sorted(SELECTORS))
def test_ties_and_empty_sequence(selector):
    """Row 0: every token's key is the same (all scores tie). Row 1: empty. Row 2: 2100 tokens whose
    keys repeat with period 3, so the k-th score sits inside a large tie group."""
    args = indexer_args(3, 36, seed=4)
    q, cache, w, seq_lens, table = args
    seq_lens[:] = torch.tensor([36 * 64, 0, 2100], dtype=seq_lens.dtype)
    raw = cache.view(torch.uint8).view(cache.shape[0], -1)  # page bytes: 64 x 128 keys, then scales
    for p in table[0].tolist():
        raw[p, :64 * 128] = raw[table[0, 0], :128].repeat(64)
        raw[p, 64 * 128:] = raw[table[0, 0], 64 * 128:64 * 128 + 4].repeat(64)
    for j in range(0, 2100):
        p, s = table[2, j // 64], j % 64
        src_p, src_s = table[2, (j % 3) // 64], (j % 3) % 64
        raw[p, s * 128:(s + 1) * 128] = raw[src_p, src_s * 128:(src_s + 1) * 128]
        raw[p, 8192 + 4 * s:8192 + 4 * s + 4] = raw[src_p, 8192 + 4 * src_s:8192 + 4 * src_s + 4]
    out = SELECTORS[selector](*args)
    v = indexer_verdict(args, out)
    assert v.passed, v.message
    assert (out[1] == -1).all()


def test_gate_rejects_a_broken_selection():
    args = indexer_args(2, 40, seed=5)
    out = X.indexer_radix(*args)
    assert indexer_verdict(args, out).passed
    dup = out.clone()
    dup[0, 5] = dup[0, 6]
    assert not indexer_verdict(args, dup).passed
    worst = out.clone()  # swap a selected token for the lowest-scoring one not selected
    scores, ids = dsa_spec.indexer_scores(*args)
    chosen = set(out[0].tolist())
    order = scores[0].argsort()
    lowest = next(int(ids[0, j]) for j in order.tolist() if int(ids[0, j]) not in chosen and ids[0, j] >= 0)
    top = int(out[0][scores[0][[int((ids[0] == t).nonzero()) for t in out[0, :50].tolist()]].argmax()])
    worst[0][out[0] == top] = lowest
    assert not indexer_verdict(args, worst).passed


def test_registration_and_supports():
    registry.discover()
    radix = registry.get(INDEXER, "triton_fp8_radix")
    assert radix.declines({"batch_size": 4, "max_num_pages": 128, "num_pages": 10}) is None
    assert "8192 tokens" in radix.declines({"batch_size": 4, "max_num_pages": 129, "num_pages": 10})
    assert registry.get(INDEXER, "triton_fp8_torch_topk").backend == "triton"
    with pytest.raises(ValueError):
        X.indexer_radix(*indexer_args(1, 129, seed=6, num_pages=200))


P = kernel_module("kdispatch.kernels.triton.dsa.indexer_passthrough")


@pytest.mark.parametrize("batch,max_pages", [(1, 1), (3, 5), (4, 32)])
def test_triton_passthrough_passes_the_gate(batch, max_pages):
    args = indexer_args(batch, max_pages, seed=7)
    args[3][0] = 0  # an empty sequence: an all -1 row
    out = P.indexer_passthrough_triton(*args)
    v = indexer_verdict(args, out)
    assert v.passed, v.message
    assert (out[0] == -1).all()
    if batch > 1:
        out[-1, 0] = -1  # one token dropped: must fail
        assert not indexer_verdict(args, out).passed
    with pytest.raises(ValueError):
        P.indexer_passthrough_triton(*indexer_args(1, 33, seed=8))
