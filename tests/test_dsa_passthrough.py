"""The indexer's pass-through variant against the reference, with FlashInfer-Bench's set semantics."""
import pytest
import torch

from kdispatch import registry
from kdispatch.workloads import materialize

INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"


def selected_sets(topk: torch.Tensor):
    return [set(row[row >= 0].tolist()) for row in topk]


@pytest.mark.parametrize("batch,pages", [(1, 1), (3, 5), (4, 32)])
def test_passthrough_selects_every_token(batch, pages):
    args = materialize(INDEXER, {"axes": {"batch_size": batch, "max_num_pages": pages, "num_pages": 256},
                                 "inputs": {}, "uuid": f"pt-{batch}-{pages}"}, seed=3)
    seq_lens = args[3]
    seq_lens[0] = 0 if batch > 1 else seq_lens[0]  # an empty sequence gives an all -1 row
    v = registry.get(INDEXER, "torch_passthrough")
    assert v.declines({"batch_size": batch, "max_num_pages": pages, "num_pages": 256}) is None
    got = v.fn(*args)
    ref = registry.get(INDEXER, "reference").fn(*args)
    assert got.dtype == torch.int32 and got.shape == (batch, 2048)
    assert selected_sets(got) == selected_sets(ref)
    for row, n in zip(got, seq_lens.tolist()):
        assert (row[:n] >= 0).all() and (row[n:] == -1).all() and len(set(row[:n].tolist())) == n


def test_passthrough_declines_long_contexts():
    v = registry.get(INDEXER, "torch_passthrough")
    assert "top-k is needed" in v.declines({"batch_size": 1, "max_num_pages": 33, "num_pages": 256})


def test_comparison_can_fail():
    args = materialize(INDEXER, {"axes": {"batch_size": 2, "max_num_pages": 3, "num_pages": 64},
                                 "inputs": {}, "uuid": "pt-fail"}, seed=4)
    got = registry.get(INDEXER, "torch_passthrough").fn(*args)
    got[0, 0] = got[0, 1]  # a duplicate drops one token
    assert selected_sets(got) != selected_sets(registry.get(INDEXER, "reference").fn(*args))
