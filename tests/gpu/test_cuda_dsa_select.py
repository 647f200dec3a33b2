"""GPU tests of the CUDA radix top-k select (kernels/cuda/dsa/topk_select.cu) behind the Triton FP8
scoring: the tuner's correctness gate (indexer set semantics: reachable, distinct, sorted scores
equal; outputs poisoned first) on contest workloads of both regimes, heavy ties (the radix search
running all three passes and stopping early), seq_len edges, and a CUDA-graph capture; the last two
and back-to-back calls also for cuda_wgmma_radix, whose select is a programmatic dependent launch;
the shared output prologue (no rows, no pages, too-wide tables) for both.
Skipped without CUDA."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kdispatch import registry
from kdispatch.tuner import gate
from kdispatch.workloads import load_workloads, materialize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TRACES = Path(__file__).resolve().parents[2] / "traces"
INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"


def _fn(name: str = "cuda_radix_select"):
    registry.discover()
    return registry.get(INDEXER, name).fn


# cuda_wgmma_radix launches the same select as a programmatic dependent of its scoring kernel
BOTH = pytest.mark.parametrize("name", ["cuda_radix_select", "cuda_wgmma_radix"])


def _workloads(scored: bool, n: int):
    ws = [w for w in load_workloads(TRACES, INDEXER) if (w.axes["max_num_pages"] * 64 > 2048) == scored]
    ws.sort(key=lambda w: (w.axes["max_num_pages"], w.axes["batch_size"]))
    return ws[::max(1, len(ws) // n)][:n] if TRACES.is_dir() else []


def _check(fn, args, what):
    v = gate.run_gate(INDEXER, fn, [(args, gate.reference(INDEXER, args))])
    assert v.passed, f"{what}: {v.status}: {v.reason}"


@pytest.mark.parametrize("workload", _workloads(True, 5) + _workloads(False, 2),
                         ids=lambda w: f"{w.axes['batch_size']}x{w.axes['max_num_pages']}")
def test_contest_workloads(workload):
    for seed in (1, 2):
        args = list(materialize(INDEXER, workload, device="cuda", seed=seed))
        _check(_fn(), args, f"{dict(workload.axes)}, seed {seed}")


def test_ties():
    """All-zero queries score every token 0: any 2048 distinct tokens of the row are right; half the
    heads zeroed leaves many exact ties at the threshold."""
    w = _workloads(True, 1)[0]
    args = list(materialize(INDEXER, w, device="cuda", seed=3))
    tied = list(args)
    tied[0] = torch.zeros_like(args[0])
    _check(_fn(), tied, "all scores tied")
    coarse = list(args)
    q = args[0].view(torch.uint8).clone()
    q[:, 32:] = 0  # fp8 zero bits
    q[:, :32] = q[:, :1]  # every live head identical: scores collapse onto fewer values
    coarse[0] = q.view(torch.float8_e4m3fn)
    _check(_fn(), coarse, "coarse scores")


@BOTH
def test_graph_capture_and_seq_len_edges(name):
    w = _workloads(True, 1)[-1]
    args = list(materialize(INDEXER, w, device="cuda", seed=4))
    lens = args[3].clone()
    width = args[4].shape[1] * 64
    lens[0], lens[-1] = 2049, width  # one past the pass-through bound, and a full table
    args[3] = lens
    fn = _fn(name)
    _check(fn, args, "seq_len edges")
    with torch.no_grad():
        fn(*args)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn(*args)
        out.fill_(-7)
        g.replay()
    torch.cuda.synchronize()
    assert not bool((out == -7).any())
    assert torch.equal(out.sort(dim=1).values, fn(*args).sort(dim=1).values)  # the replay selects the same set


def _select(scores, seq_lens, block_table):
    """The select kernel alone on given fp32 scores [B, W]."""
    from kdispatch.kernels.cuda.dsa import indexer_select as S

    out = torch.full((scores.shape[0], 2048), -7, dtype=torch.int32, device="cuda")
    S.kernel().launch(scores.shape[0], 1024, scores, seq_lens, block_table, out, scores.shape[1],
                      block_table.stride(0), 4096)  # the tables below draw page ids from 4096 pages
    torch.cuda.synchronize()
    return out


SCORE_ROWS = {
    "normal": lambda n, g: torch.randn(n, generator=g),
    "negative": lambda n, g: -torch.rand(n, generator=g) - 1.0,
    "all equal": lambda n, g: torch.full((n,), 0.25),
    "two values": lambda n, g: (torch.rand(n, generator=g) < 0.5).float(),
    "far outlier": lambda n, g: torch.cat([torch.tensor([1e30]), torch.randn(n - 1, generator=g)]),
    "quantized ties": lambda n, g: (torch.randn(n, generator=g) * 100).round() / 100,
    "signed zeros": lambda n, g: torch.where(torch.rand(n, generator=g) < 0.5, torch.tensor(0.0), torch.tensor(-0.0)),
}


@pytest.mark.parametrize("kind", sorted(SCORE_ROWS))
@pytest.mark.parametrize("seq_len", [2049, 3000, 5248, 8192])
def test_select_exact_on_crafted_scores(kind, seq_len):
    """The selected tokens' scores equal torch.topk's (as sorted multisets), ids are distinct and
    reachable: the linear pass with directly ranked candidates, and the radix fallback (all equal,
    far outliers), both exact under ties."""
    g = torch.Generator().manual_seed(seq_len)
    pages = 128
    table = torch.randperm(4096, generator=g)[:pages].to(torch.int32).view(1, pages).cuda()
    row = torch.zeros(pages * 64)
    row[:seq_len] = SCORE_ROWS[kind](seq_len, g)
    scores = row.view(1, -1).cuda()
    out = _select(scores, torch.tensor([seq_len], dtype=torch.int32, device="cuda"), table)[0]
    assert not bool((out < 0).any()), "a row longer than 2048 tokens fills every slot"
    assert out.unique().numel() == 2048, "distinct tokens"
    slot_of = {int(p) * 64 + s: i * 64 + s for i, p in enumerate(table[0].tolist()) for s in range(64)}
    pos = torch.tensor([slot_of[int(x)] for x in out.tolist()])
    assert bool((pos < seq_len).all()), "only tokens of the sequence"
    got = row[pos].sort().values
    want = row[:seq_len].topk(2048).values.sort().values
    assert torch.equal(got, want)


@BOTH
def test_back_to_back_calls_match_synchronized_ones(name):
    """Calls issued back to back on different inputs, with the scores buffers recycled by the
    caching allocator, select what the same calls select one at a time (a select that read its
    scores too early would pick up the previous call's)."""
    fn = _fn(name)
    ws = _workloads(True, 3)
    inputs = [list(materialize(INDEXER, w, device="cuda", seed=10 + i)) for i, w in enumerate(ws * 2)]
    one_at_a_time = []
    for args in inputs:
        one_at_a_time.append(fn(*args).sort(dim=1).values)
        torch.cuda.synchronize()
    back_to_back = [fn(*args) for args in inputs]
    torch.cuda.synchronize()
    for want, got in zip(one_at_a_time, back_to_back):
        assert torch.equal(got.sort(dim=1).values, want)


@BOTH
def test_empty_and_too_wide_tables(name):
    """No rows: an empty [0, 2048] output; no pages: every slot -1, no kernel; rows wider than the
    select holds (129 pages): a clear error naming the variant."""
    w = _workloads(True, 1)[0]
    q, k, weights, seq_lens, bt = materialize(INDEXER, w, device="cuda", seed=5)
    fn = _fn(name)
    assert fn(q[:0], k, weights[:0], seq_lens[:0], bt[:0]).shape == (0, 2048)
    out = fn(q, k, weights, torch.zeros_like(seq_lens), bt[:, :0])
    assert out.shape == (q.shape[0], 2048) and bool((out == -1).all())
    wide = torch.zeros(bt.shape[0], 129, dtype=bt.dtype, device=bt.device)
    with pytest.raises(ValueError, match=f"{name} holds rows of at most 8192 tokens"):
        fn(q, k, weights, seq_lens, wide)
