"""GPU tests of the CUDA FP8 wgmma indexer scoring (kernels/cuda/dsa/indexer_score.cu): its scores
against the Triton scoring's on the slots both define (rows over 2048 tokens, up to seq_len), for
several pages a CTA (one page, the ring's depth, more pages than stages, a CTA's pages cut by
seq_len and by the table's end); out-of-range page ids score 0. The variant's gate (contest
workloads, CUDA graphs) runs in test_triton_dsa_moe.py. Skipped without CUDA."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kdispatch.workloads import load_workloads, materialize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TRACES = Path(__file__).resolve().parents[2] / "traces"
INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"


def _scored_workload(pages: int):
    ws = [w for w in load_workloads(TRACES, INDEXER) if w.axes["max_num_pages"] * 64 > 2048]
    return min(ws, key=lambda w: (abs(w.axes["max_num_pages"] - pages), -w.axes["batch_size"]))


def _defined(seq_lens, width):
    """Mask [B, width] of the slots both scorings write: rows over 2048 tokens, slots < seq_len."""
    slot = torch.arange(width, device=seq_lens.device)
    return (slot[None, :] < seq_lens.clamp(max=width)[:, None]) & (seq_lens[:, None] > 2048)


@pytest.mark.parametrize("pages", [None, 1, 2, 3, 4, 5, 9, 200])
@pytest.mark.parametrize("band", [34, 91])
def test_scores_match_triton(pages, band):
    from kdispatch.kernels.cuda.dsa import indexer_wgmma as W
    from kdispatch.kernels.triton.dsa import indexer_fp8 as X

    args = list(materialize(INDEXER, _scored_workload(band), device="cuda", seed=5))
    lens = args[3].clone()
    width = args[4].shape[1] * 64
    lens[0], lens[-1] = 2049, width + 64  # one token on the last page; a seq_len past the table
    args[3] = lens
    want = X.score_pages(*args, skip_short=True)
    got = W.score_pages(*args, pages=pages)
    ok = _defined(lens, width)
    assert bool(ok.any())
    assert bool(torch.isfinite(got[ok]).all())
    scale = want[ok].abs().max()
    assert float((got[ok] - want[ok]).abs().max()) <= 1e-5 * float(scale)


def test_bad_page_ids_score_zero():
    from kdispatch.kernels.cuda.dsa import indexer_wgmma as W

    args = list(materialize(INDEXER, _scored_workload(91), device="cuda", seed=6))
    table = args[4].clone()
    num_pages = args[1].shape[0]
    long_rows = (args[3] > 2048).nonzero().flatten().tolist()
    r = long_rows[0]
    table[r, 0], table[r, 1] = -5, num_pages  # out of range both ways
    args[4] = table
    got = W.score_pages(*args, pages=2)
    assert bool((got[r, :128] == 0).all())
    ok = _defined(args[3], table.shape[1] * 64)
    assert bool(torch.isfinite(got[ok]).all())
