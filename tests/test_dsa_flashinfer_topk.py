"""CPU tests of the indexer with FlashInfer's top-k transform (kernels/library/dsa/flashinfer_topk.py):
the Triton scoring runs under the interpreter, and FlashInfer's `top_k_page_table_transform` is
stood in for by its documented contract (no FlashInfer here), which also asserts the preconditions
FlashInfer does not check: every table entry it maps is non-negative and every id fits int32. The
wrapper's own work is what is tested: invalid page ids never reach the transform, their tokens are
never chosen over real ones and come out -1, lengths beyond the table are clamped."""
import types

import pytest
import torch

pytest.importorskip("triton")

from conftest import indexer_args, indexer_verdict, kernel_module  # noqa: E402

X = kernel_module("kdispatch.kernels.library.dsa.flashinfer_topk")


def fake_transform(input, src_page_table, lengths, k, *, page_size, out, out_raw_indices):
    """FlashInfer's contract: per row, the k best of its first lengths[r] scores (all of them when
    fewer), in no particular order, mapped through the table; -1 after."""
    assert input.stride(-1) == 1 and src_page_table.dtype == torch.int32 and lengths.dtype == torch.int32
    assert not lengths.numel() or int(lengths.max()) <= input.shape[1]
    out.fill_(-1)
    out_raw_indices.fill_(-1)
    for r in range(input.shape[0]):
        n = int(lengths[r])
        idx = torch.topk(input[r, :n], min(k, n)).indices
        idx = idx[torch.randperm(idx.numel())]  # the order is FlashInfer's own
        pages = src_page_table[r, idx // page_size].long()
        assert bool((pages >= 0).all()), "a negative page id reached the transform"
        ids = pages * page_size + idx % page_size
        assert bool((ids < 2**31).all()), "an id past int32 reached the transform"
        out[r, :idx.numel()] = ids.to(torch.int32)
        out_raw_indices[r, :idx.numel()] = idx.to(torch.int32)
    return out


@pytest.fixture(autouse=True)
def fake_flashinfer(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "flashinfer",
                        types.SimpleNamespace(top_k_page_table_transform=fake_transform))


@pytest.mark.parametrize("batch,max_pages,seed", [(2, 40, 1), (3, 5, 2)])
def test_passes_the_gate(batch, max_pages, seed):
    args = indexer_args(batch, max_pages, seed, tag="fi")
    out = X.dsa_indexer_triton_flashinfer_topk(*args)
    assert out.dtype == torch.int32 and out.shape == (batch, 2048)
    v = indexer_verdict(args, out)
    assert v.passed, v.reason


def test_page_ids_outside_the_cache_are_never_chosen_and_never_mapped():
    """Row 0: 40 pages, ten of them ids outside [0, num_pages): fewer than 2048 real tokens remain
    within its length, so the selection reaches its invalid pages' tokens, which must come out -1.
    Row 1: a length past the table's width (clamped). The gate's reference treats those tokens as
    padding."""
    args = indexer_args(2, 40, seed=3, tag="fi")
    num_pages = args[1].shape[0]
    table = args[4].clone()
    table[0, ::4] = torch.tensor([-5, num_pages, num_pages + 7, 2**30, -1, 2**31 - 1, num_pages, -2, 99999, -3],
                                 dtype=table.dtype)
    args[4] = table
    args[3] = torch.tensor([40 * 64, 40 * 64 + 500], dtype=args[3].dtype)
    out = X.dsa_indexer_triton_flashinfer_topk(*args)
    ids = out[out >= 0]
    assert bool((ids // 64 < num_pages).all())
    real_tokens = int(((table[0] >= 0) & (table[0] < num_pages)).sum()) * 64
    assert int((out[0] >= 0).sum()) == real_tokens < 2048
    v = indexer_verdict(args, out)
    assert v.passed, v.reason


@pytest.mark.parametrize("aot,cached,ready", [(False, False, False), (True, False, True), (False, True, True)])
def test_runs_only_where_the_topk_module_is_built(monkeypatch, tmp_path, aot, cached, ready):
    """The probe asks FlashInfer's spec of the "topk" module, never builds it: a prebuilt (AOT)
    module or the JIT cache's .so is ready, neither is not (a call would compile for minutes)."""
    so = tmp_path / "topk.so"
    if cached:
        so.write_bytes(b"")
    spec = types.SimpleNamespace(is_aot=aot, jit_library_path=so)
    jit = types.ModuleType("flashinfer.jit.topk")
    jit.gen_topk_module = lambda: spec
    monkeypatch.setitem(__import__("sys").modules, "flashinfer.jit.topk", jit)
    monkeypatch.setitem(__import__("sys").modules, "flashinfer.jit", types.ModuleType("flashinfer.jit"))
    answer = X.topk_module_ready()
    assert (answer is None) == ready
    if not ready:
        assert "not built" in answer
