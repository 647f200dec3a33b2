"""GPU tests of the Triton DSA and MoE variants on contest workloads (traces/), at full size.

Each variant goes through the tuner's correctness gate (outputs poisoned before the call, NaN/Inf
fail, the definition's comparison: indexer set semantics, sparse-attention output + lse, MoE matched
ratio) against the project's reference, on a few workloads of every regime, then is captured in a
CUDA graph and replayed (no host sync allowed inside). Skipped without CUDA.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kdispatch import registry
from kdispatch.workloads import load_workloads, materialize
from kdispatch.tuner import gate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TRACES = Path(__file__).resolve().parents[2] / "traces"
INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"
SPARSE = "dsa_sparse_attention_h16_ckv512_kpe64_topk2048_ps64"
MOE = "moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048"


def _workloads(definition, pick):
    ws = load_workloads(TRACES, definition)
    return [w for w in ws if pick(dict(w.axes))]


def _spread(ws, n):
    """n workloads spread over the list (sorted by the list's order)."""
    step = max(1, len(ws) // n)
    return ws[::step][:n]


def _gate_and_graph(definition, name, workload):
    registry.discover()
    fn = registry.get(definition, name).fn
    args = list(materialize(definition, workload, device="cuda", seed=1))
    v = gate.run_gate(definition, fn, [(args, gate.reference(definition, args))])
    assert v.passed, f"{name} on {dict(workload.axes)}: {v.status}: {v.reason}"
    torch.cuda.synchronize()
    with torch.no_grad():
        fn(*args)  # compile outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn(*args)
        g.replay()
    torch.cuda.synchronize()
    first = out if isinstance(out, torch.Tensor) else out[0]
    assert first.numel() == 0 or bool(torch.isfinite(first.float()).all()) or first.dtype == torch.int32


_SCORED = _spread(_workloads(INDEXER, lambda a: a["max_num_pages"] * 64 > 2048), 6) if TRACES.is_dir() else []


@pytest.mark.parametrize("name", ["triton_fp8_radix", "triton_fp8_torch_topk", "cuda_radix_select", "cuda_wgmma_radix"])
@pytest.mark.parametrize("workload", _SCORED, ids=lambda w: f"{w.axes['batch_size']}x{w.axes['max_num_pages']}")
def test_indexer_scored_regime(name, workload):
    _gate_and_graph(INDEXER, name, workload)


_SHORT = _spread(_workloads(INDEXER, lambda a: a["max_num_pages"] * 64 <= 2048), 3) if TRACES.is_dir() else []


@pytest.mark.parametrize("name", ["triton_fp8_radix", "torch_passthrough", "triton_passthrough", "cuda_radix_select",
                                  "cuda_wgmma_radix"])
@pytest.mark.parametrize("workload", _SHORT, ids=lambda w: f"{w.axes['batch_size']}x{w.axes['max_num_pages']}")
def test_indexer_short_regime(name, workload):
    _gate_and_graph(INDEXER, name, workload)


@pytest.mark.parametrize("workload", _spread(_workloads(SPARSE, lambda a: True), 4) if TRACES.is_dir() else [],
                         ids=lambda w: f"T{w.axes['num_tokens']}")
def test_sparse_attention_splitk(workload):
    _gate_and_graph(SPARSE, "triton_splitk.b64s16", workload)


@pytest.mark.parametrize("name", ["triton_grouped_m16.fr", "triton_grouped_m32.fr", "triton_grouped_m64.fr"])
@pytest.mark.parametrize("seq_len", [1, 80, 901])
def test_moe_grouped(name, seq_len):
    ws = _workloads(MOE, lambda a: a["seq_len"] == seq_len)
    assert ws, f"no MoE workload with seq_len {seq_len}"
    _gate_and_graph(MOE, name, ws[0])
