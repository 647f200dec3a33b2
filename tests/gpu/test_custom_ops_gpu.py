"""The custom ops on the GPU: torch.compile(fullgraph=True) with inductor passes the correctness gate
for every op, and after kdispatch.ops.warmup a CUDA-graph capture of each op compiles no kernel and makes
no new decision, and its replay passes the gate. Skipped without CUDA."""
import pytest
import torch

import kdispatch
from kdispatch import nvrtc
from kdispatch.tuner import gate
from kdispatch.workloads import materialize

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHAPES = {
    "gdn_decode": {"batch_size": 32},
    "gdn_prefill": {"total_seq_len": 300, "num_seqs": 4},
    "dsa_topk_indexer": {"batch_size": 4, "max_num_pages": 90, "num_pages": 2000},
    "dsa_sparse_attention": {"num_tokens": 8, "num_pages": 2000},
    "moe_fp8": {"seq_len": 16},
}


def trials(op, tag):
    w = {"uuid": f"custom-ops-{tag}-{op}", "axes": SHAPES[op], "inputs": {}}
    out = []
    for t in range(2):
        args = list(materialize(op, gate.trial_workload(w, t), device="cuda"))
        out.append((args, gate.reference(op, args)))
    return out


@pytest.mark.parametrize("op", sorted(SHAPES))
def test_compiled_op_passes_the_gate(op):
    fn = getattr(kdispatch.ops, op)
    compiled = torch.compile(lambda *a: fn(*a), fullgraph=True)
    verdict = gate.run_gate(op, compiled, trials(op, "compiled"))
    assert verdict.passed, f"{op}: {verdict.status} {verdict.reason}"


@pytest.mark.parametrize("op", sorted(SHAPES))
def test_capture_after_warmup_compiles_nothing(op):
    [(_, graph_variant, _)] = kdispatch.ops.warmup(op, [SHAPES[op]])
    d = kdispatch.ops.DISPATCHERS[op]
    fn = getattr(kdispatch.ops, op)
    before = (dict(nvrtc.stats), sum(len(b) for b in d._entries.values()))

    def captured(*args):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn(*args)
        g.replay()
        return out

    verdict = gate.run_gate(op, captured, trials(op, "captured"))
    assert verdict.passed, f"{op} ({graph_variant} captured): {verdict.status} {verdict.reason}"
    assert (dict(nvrtc.stats), sum(len(b) for b in d._entries.values())) == before, \
        "the capture compiled a kernel or routed a new signature"
