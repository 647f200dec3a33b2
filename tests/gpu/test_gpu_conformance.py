"""Every variant that runs on this GPU through the correctness gate, on small contest-like shapes
(tests/test_conformance.py does the CPU-runnable ones in CI). Skipped without CUDA."""
import pytest
import torch

from conftest import runnable_variant, variant_cases, with_an_empty_sequence
from kdispatch import registry
from kdispatch.tuner import gate
from kdispatch.workloads import materialize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHAPES = {
    "gdn_decode": [{"batch_size": 1}, {"batch_size": 33}],
    "gdn_prefill": [{"total_seq_len": 1, "num_seqs": 1}, {"total_seq_len": 300, "num_seqs": 4}],
    "dsa_topk_indexer": [{"batch_size": 2, "max_num_pages": 20, "num_pages": 400},
                         {"batch_size": 4, "max_num_pages": 90, "num_pages": 2000}],
    "dsa_sparse_attention": [{"num_tokens": 1, "num_pages": 2000}, {"num_tokens": 8, "num_pages": 2000}],
    "moe_fp8": [{"seq_len": 1}, {"seq_len": 80}],
    **{f"gdn_decode_packed_qk{hq}_v{hv}": [{"batch_size": 1, "num_slots": 2}, {"batch_size": 37, "num_slots": 50}]
       for hq, hv in ((16, 32), (8, 16), (4, 8), (2, 4))},
    **{f"gdn_prefill_pool_qk{hq}_v{hv}": [{"total_seq_len": 300, "num_seqs": 9, "num_slots": 12}]
       for hq, hv in ((16, 32), (8, 16), (4, 8), (2, 4))},
    **{f"gdn_prefill_gathered_qk{hq}_v{hv}": [{"total_seq_len": 300, "num_seqs": 9}]
       for hq, hv in ((16, 32), (8, 16), (4, 8), (2, 4))},
    **{f"gdn_verify_qk{hq}_v{hv}": [{"num_seqs": 1, "cache_steps": 2, "total_seq_len": 2, "num_slots": 2,
                                     "num_cache_rows": 1},
                                    {"num_seqs": 37, "cache_steps": 4, "total_seq_len": 148, "num_slots": 50,
                                     "num_cache_rows": 40}] for hq, hv in ((16, 32), (8, 16), (4, 8), (2, 4))},
    **{f"gdn_verify_steps_qk{hq}_v{hv}": [{"num_seqs": 1, "num_steps": 2, "total_seq_len": 2, "num_slots": 3},
                                          {"num_seqs": 37, "num_steps": 4, "total_seq_len": 148, "num_slots": 160}]
       for hq, hv in ((16, 32), (8, 16), (4, 8), (2, 4))},
}


def test_every_kernel_module_imports():
    assert registry.import_failures() == {}  # a module that fails to import hides its variants


@pytest.mark.parametrize("short,name,axes", variant_cases(SHAPES))
def test_variant_passes_the_gate_on_the_gpu(short, name, axes):
    v = runnable_variant(short, name, axes)
    w = {"uuid": f"gpu-conformance-{short}-{'-'.join(map(str, axes.values()))}", "axes": axes, "inputs": {}}
    trials = []
    for t in range(2):
        args = list(materialize(short, gate.trial_workload(w, t), device="cuda"))
        trials.append((args, gate.reference(short, args)))
    verdict = gate.run_gate(short, v.fn, trials)
    assert verdict.passed, f"{short} {name} {axes}: {verdict.status} {verdict.reason}"


# Every prefill convention with an empty sequence that continues a state, starting mid-block (the
# trace sets have none): tests/test_conformance.py does the CPU-runnable ones.
EMPTY_SEQUENCE = {short: SHAPES[short][-1:] for short in SHAPES if short.startswith("gdn_prefill")}


@pytest.mark.parametrize("short,name,axes", variant_cases(EMPTY_SEQUENCE))
def test_prefill_keeps_an_empty_sequence_state_on_the_gpu(short, name, axes):
    v = runnable_variant(short, name, axes)
    w = {"uuid": f"gpu-conformance-empty-{short}", "axes": axes, "inputs": {}}
    args = with_an_empty_sequence(short, list(materialize(short, w, device="cuda")))
    verdict = gate.run_gate(short, v.fn, [(args, gate.reference(short, args))])
    assert verdict.passed, f"{short} {name} {axes}: {verdict.status} {verdict.reason}"
