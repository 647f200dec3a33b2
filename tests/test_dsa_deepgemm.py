"""The DeepGEMM indexer peer's glue (kernels/library/dsa/deepgemm.py) on the CPU, against a stand-in
for DeepGEMM 2.6.1's `fp8_paged_mqa_logits` that keeps the real one's contract and its hazards:
2-D int32 context lengths, next_n = 1 queries, the uint8 cache view, a schedule made for the same
SM count, block-table entries read unchecked (the stand-in fails on one outside the cache, where
the real kernel would read out of bounds), logits past a row's length left as garbage (NaN here)
and a padded row stride. The peer's ids must pass the correctness gate on valid and hostile inputs
(tests/hostile.py), with batches cut into SM-sized chunks. Both top-k halves: torch.topk, and
FlashInfer's transform as tests/test_dsa_flashinfer_topk.py stands it in."""
import sys
import types

import pytest
import torch

pytest.importorskip("triton")

from conftest import INDEXER, indexer_args, indexer_verdict  # noqa: E402
from hostile import hostile  # noqa: E402
from test_dsa_flashinfer_topk import fake_transform  # noqa: E402
from kdispatch.definitions.dsa_paged import spec as dsa_spec  # noqa: E402
from kdispatch.tuner import gate  # noqa: E402

SMS = 3  # fewer than the batches below: the peer must chunk


def _fake_deep_gemm(calls):
    def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms):
        assert context_lens.dtype == torch.int32 and context_lens.dim() == 2 and context_lens.is_contiguous()
        assert block_kv == 64 and num_sms == SMS and context_lens.shape[0] <= SMS
        return torch.full((num_sms + 1, 2), 7, dtype=torch.int32)

    def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len,
                             clean_logits=False):
        batch = q.shape[0]
        assert q.shape[1:] == (1, 64, 128) and q.dtype == torch.float8_e4m3fn and q.is_contiguous()
        assert kv_cache.dtype == torch.uint8 and kv_cache.shape[1:] == (64, 1, 132) and kv_cache.stride(1) == 132
        assert weights.shape == (batch, 64) and weights.dtype == torch.float32 and weights.is_contiguous()
        assert context_lens.shape == (batch, 1) and context_lens.dtype == torch.int32
        assert block_table.dtype == torch.int32 and block_table.stride(1) == 1 and schedule_meta.shape == (SMS + 1, 2)
        assert not clean_logits, "DeepGEMM refuses clean_logits with 2-D context lengths"
        lens = context_lens[:, 0].long()
        assert int(lens.max()) <= max_context_len
        for b in range(batch):  # the pages the kernel reads, unchecked
            read = block_table[b, : (int(lens[b]) + 63) // 64]
            assert ((read >= 0) & (read < kv_cache.shape[0])).all(), "DeepGEMM would read outside the cache"
        scores, _ = dsa_spec.indexer_scores(q[:, 0], kv_cache.view(torch.int8), weights, lens, block_table)
        scores = scores[:, :max_context_len]
        padded = torch.full((batch, max_context_len + 256), float("nan"))  # garbage past each length
        padded[:, :max_context_len] = torch.where(torch.arange(max_context_len)[None, :] < lens[:, None], scores,
                                                  float("nan"))
        calls.append(batch)
        return padded[:, :max_context_len]

    return types.SimpleNamespace(get_num_sms=lambda: SMS, get_paged_mqa_logits_metadata=get_paged_mqa_logits_metadata,
                                 fp8_paged_mqa_logits=fp8_paged_mqa_logits)


@pytest.fixture(params=["torch_topk", "flashinfer_topk"])
def peer(monkeypatch, request):
    calls = []
    monkeypatch.setitem(sys.modules, "deep_gemm", _fake_deep_gemm(calls))
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(top_k_page_table_transform=fake_transform))
    from kdispatch.kernels.library.dsa import deepgemm
    fn = deepgemm.dsa_indexer_deepgemm if request.param == "torch_topk" else deepgemm.dsa_indexer_deepgemm_flashinfer
    return fn, calls


@pytest.mark.parametrize("batch,max_pages,seed,hostile_seed", [(2, 5, 0, None), (7, 40, 1, None), (5, 12, 2, 0),
                                                              (8, 36, 3, 1), (6, 9, 4, "lengths")])
def test_peer_passes_the_gate(peer, batch, max_pages, seed, hostile_seed):
    fn, calls = peer
    args = indexer_args(batch, max_pages, seed, tag="deepgemm", num_pages=120)
    if hostile_seed == "lengths":  # past the table's width, negative, the int32 extremes
        args[3] = torch.tensor([max_pages * 64 + 1, -1, 2**31 - 1, -2**31, 0, 70], dtype=torch.int32)
    elif hostile_seed is not None:
        args = hostile("dsa_topk_indexer", args, hostile_seed)
    verdict = gate.run_gate(INDEXER, fn, [(args, gate.reference(INDEXER, args))])
    assert verdict.passed, f"{verdict.status} {verdict.reason}"
    assert calls[-((batch + SMS - 1) // SMS):] == [min(SMS, batch - s) for s in range(0, batch, SMS)]


def test_a_wrong_mapping_fails_the_gate(peer):
    fn, _ = peer
    args = indexer_args(4, 20, 5, tag="deepgemm", num_pages=120)
    out = fn(*args)
    bad = torch.where(out >= 0, out ^ 1, out)  # the neighbouring slot of every selected token
    assert not indexer_verdict(args, bad).passed


def test_the_sm90_baseline_prefers_flashinfer_topk_then_torch_topk_then_the_reference(monkeypatch):
    """What an H100 user of SGLang runs is the baseline: DeepGEMM's logits with FlashInfer's top-k where
    its module is built, with torch.topk where it is not, the reference (and why) without DeepGEMM."""
    from kdispatch import registry

    registry.discover()
    peers = {v.name: v for v in registry.variants(INDEXER) if v.name.startswith("deepgemm_")}
    assert set(peers) == {"deepgemm_flashinfer_topk", "deepgemm_torch_topk"}
    assert all(v.baseline and v.archs == ("sm90",) for v in peers.values())

    def state(flashinfer_topk_built):
        registry._BASELINES.clear()
        for v in peers.values():
            monkeypatch.setattr(v, "missing", ())
        monkeypatch.setattr(peers["deepgemm_flashinfer_topk"], "not_ready",
                            None if flashinfer_topk_built else "FlashInfer's top-k module is not built")
        return registry.baseline(INDEXER, "sm90").name

    try:
        assert state(True) == "deepgemm_flashinfer_topk"
        assert state(False) == "deepgemm_torch_topk"
        assert registry.baseline(INDEXER, "sm100").name == "reference"
        monkeypatch.setattr(peers["deepgemm_torch_topk"], "missing", ("deep_gemm",))
        registry._BASELINES.clear()
        assert registry.baseline(INDEXER, "sm90").name == "reference"
        assert any("deep_gemm" in gap for gap in registry.baseline_gaps(INDEXER, "sm90"))
    finally:
        monkeypatch.undo()
        registry._BASELINES.clear()
