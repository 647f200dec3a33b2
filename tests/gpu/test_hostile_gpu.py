"""Fuzzed hostile index tensors through every variant of the indexed definitions on the GPU:
no illegal address, and the outputs equal the reference's padding semantics (the correctness gate
on the corrupted inputs). Skipped without CUDA; tests/gpu/sanitize.py runs the same inputs under
compute-sanitizer."""
import pytest
import torch

from conftest import runnable_variant, variant_cases
from hostile import (GATHERED_PREFILL, INDEXED, PACKED, POOL_PREFILL, VERIFY, VERIFY_STEPS, hostile,
                     sparse_attention_shapes)
from kdispatch.tuner import gate
from kdispatch.workloads import materialize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHAPES = {
    "dsa_topk_indexer": [{"batch_size": 6, "max_num_pages": 20, "num_pages": 400},
                         {"batch_size": 6, "max_num_pages": 90, "num_pages": 600}],
    "dsa_sparse_attention": sparse_attention_shapes(num_pages=300),
    "gdn_prefill": [{"total_seq_len": 40, "num_seqs": 1}, {"total_seq_len": 300, "num_seqs": 5}],
    **{short: [{"batch_size": 1, "num_slots": 2}, {"batch_size": 40, "num_slots": 50}] for short in PACKED},
    **{short: [{"total_seq_len": 300, "num_seqs": 9, "num_slots": 12}] for short in POOL_PREFILL},
    **{short: [{"total_seq_len": 300, "num_seqs": 9}] for short in GATHERED_PREFILL},
    **{short: [{"num_seqs": 40, "cache_steps": 4, "total_seq_len": 160, "num_slots": 50, "num_cache_rows": 45}]
       for short in VERIFY},
    **{short: [{"num_seqs": 40, "num_steps": 4, "total_seq_len": 160, "num_slots": 170}] for short in VERIFY_STEPS},
}
SEEDS = range(7)  # gdn_prefill: one malformed kind each (hostile.MALFORMED_CU)


@pytest.mark.parametrize("short,name,axes", variant_cases({short: SHAPES[short] for short in INDEXED}))
def test_hostile_indices_are_padding(short, name, axes):
    v = runnable_variant(short, name, axes)
    w = {"uuid": f"hostile-{short}-{'-'.join(map(str, axes.values()))}", "axes": axes, "inputs": {}}
    for seed in SEEDS:
        args = hostile(short, materialize(short, gate.trial_workload(w, seed), device="cuda"), seed)
        verdict = gate.run_gate(short, v.fn, [(args, gate.reference(short, args))])
        torch.cuda.synchronize()  # an illegal address surfaces here
        assert verdict.passed, f"{short} {name} {axes} seed {seed}: {verdict.status} {verdict.reason}"
