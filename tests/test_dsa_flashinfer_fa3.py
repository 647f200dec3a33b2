"""CPU tests of the sparse-attention peer on FlashInfer's FA3 MLA wrapper (kernels/library/dsa/flashinfer_fa3.py).
No FlashInfer kernel runs here: the wrapper is stood in for by its contract as the variant uses it
(CSR metadata with host-side offsets and lengths, page size 1, one query row a request, base-2 lse),
which also asserts what FlashInfer does not check: every id it is given lies in the cache and every
planned request has at least one. What is tested is the variant's own work: which ids reach the
plan and in what order, the tokens without a valid id, and the readiness probe."""
import sys
import types

import pytest
import torch

from conftest import kernel_module
from kdispatch import workloads
from kdispatch.tuner import gate

X = kernel_module("kdispatch.kernels.library.dsa.flashinfer_fa3")
DEF = "dsa_sparse_attention"


class FakeMetadata:
    @classmethod
    def csr(cls, qo_indptr, kv_indptr, kv_indices, kv_len_arr):
        m = cls()
        m.qo_indptr, m.kv_indptr, m.kv_indices, m.kv_len_arr = qo_indptr, kv_indptr, kv_indices, kv_len_arr
        return m


class FakeWrapper:
    def __init__(self, workspace, backend):
        assert backend == "fa3"

    def plan(self, *, metadata, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale,
             q_data_type, kv_data_type, lse_mode, query_layout, kv_cache_layout):
        m = metadata
        # a plan's layouts bind its runs: FlashInfer refuses split tensors under a packed plan
        assert query_layout == kv_cache_layout == "split"
        assert (num_heads, head_dim_ckv, head_dim_kpe, page_size, causal) == (16, 512, 64, 1, False)
        assert lse_mode == "base2" and q_data_type == kv_data_type == torch.bfloat16
        assert m.qo_indptr.device.type == m.kv_indptr.device.type == m.kv_len_arr.device.type == "cpu"
        n = m.kv_len_arr.numel()
        assert torch.equal(m.qo_indptr, torch.arange(n + 1, dtype=torch.int32)), "one query row a request"
        assert bool((m.kv_len_arr > 0).all()), "a request without a page was planned"
        assert torch.equal(m.kv_indptr[1:] - m.kv_indptr[:-1], m.kv_len_arr)
        assert m.kv_indices.dtype == torch.int32 and m.kv_indices.numel() == int(m.kv_indptr[-1])
        self.m, self.sm_scale = m, sm_scale

    def run(self, *, query, kv_cache, return_lse):
        (q_nope, q_pe), (ckv, kpe) = query, kv_cache
        assert return_lse and ckv.shape[1:] == (1, 512) and kpe.shape[1:] == (1, 64)
        m = self.m
        ids = m.kv_indices.long()
        assert bool(((ids >= 0) & (ids < ckv.shape[0])).all()), "an id outside the cache reached the kernel"
        out = torch.empty(q_nope.shape, dtype=torch.bfloat16)
        lse = torch.empty(q_nope.shape[:2], dtype=torch.float32)
        for r in range(m.kv_len_arr.numel()):
            sel = ids[int(m.kv_indptr[r]):int(m.kv_indptr[r + 1])]
            k_nope, k_pe = ckv[sel, 0].float(), kpe[sel, 0].float()
            logits = (q_nope[r].float() @ k_nope.T + q_pe[r].float() @ k_pe.T) * self.sm_scale
            out[r] = (torch.softmax(logits, dim=-1) @ k_nope).to(torch.bfloat16)
            lse[r] = torch.logsumexp(logits, dim=-1) / torch.log(torch.tensor(2.0))
        return out, lse


@pytest.fixture(autouse=True)
def fake_flashinfer(monkeypatch, tmp_path):
    """FlashInfer's modules the variant imports, as stand-ins: the wrapper above, and the JIT
    environment the probe asks (an empty JIT cache in tmp_path, no prebuilt module)."""
    package = types.ModuleType("flashinfer")
    mla = types.ModuleType("flashinfer.mla")
    mla.MLAPlanMetadata, mla.BatchMLAPagedAttentionWrapper = FakeMetadata, FakeWrapper
    jit = types.ModuleType("flashinfer.jit")
    jit.env = types.SimpleNamespace(FLASHINFER_JIT_DIR=tmp_path, get_aot_artifacts=lambda name: ())
    modules = types.ModuleType("flashinfer.jit.attention.modules")
    modules.get_batch_mla_uri = lambda *key: "batch_mla_" + "_".join(map(str, key))
    for name, module in {"flashinfer": package, "flashinfer.mla": mla, "flashinfer.jit": jit,
                         "flashinfer.jit.attention": types.ModuleType("flashinfer.jit.attention"),
                         "flashinfer.jit.attention.modules": modules}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(X, "_wrappers", {})
    return jit.env


def _args(T, P, seed):
    return list(workloads.materialize(DEF, {"axes": {"num_tokens": T, "num_pages": P}, "inputs": {},
                                            "uuid": f"fa3-{T}-{P}"}, seed=seed))


def _verdict(args, outputs):
    return gate.check_outputs(DEF, args, outputs, gate.reference(DEF, args))


@pytest.mark.parametrize("T,P,seed", [(3, 40, 1), (5, 9, 2)])
def test_passes_the_gate(T, P, seed):
    args = _args(T, P, seed)
    v = _verdict(args, X.dsa_sparse_attention_flashinfer_fa3(*args))
    assert v.passed, v.reason


def test_unused_ids_never_reach_the_kernel_and_empty_tokens_get_zeros():
    """Token 0: every id unused (-1 and values outside the cache); token 1: unused ids scattered
    among valid ones, not only after them; token 2 as generated."""
    args = _args(3, 12, seed=4)
    idx = args[4].clone()
    tokens = 12 * 64
    idx[0] = torch.tensor([-1, tokens, -7, 2**31 - 1] * 512, dtype=idx.dtype)
    idx[1, ::3] = -1
    idx[1, 1::7] = tokens + 5
    args[4] = idx
    out, lse = X.dsa_sparse_attention_flashinfer_fa3(*args)
    assert bool((out[0] == 0).all()) and bool((lse[0] == float("-inf")).all())
    v = _verdict(args, (out, lse))
    assert v.passed, v.reason


def test_no_valid_id_anywhere():
    args = _args(2, 4, seed=5)
    args[4] = torch.full_like(args[4], -1)
    out, lse = X.dsa_sparse_attention_flashinfer_fa3(*args)
    assert bool((out == 0).all()) and bool((lse == float("-inf")).all())


@pytest.mark.parametrize("aot,cached,ready", [(False, False, False), (True, False, True), (False, True, True)])
def test_runs_only_where_the_module_is_built(fake_flashinfer, aot, cached, ready):
    """The probe asks FlashInfer by the module's name for a prebuilt module or the JIT cache's
    .so, and builds nothing."""
    env = fake_flashinfer
    name = X.fa3_module_name()
    assert "fa3" in name and "512" in name and "64" in name
    if cached:
        (env.FLASHINFER_JIT_DIR / name).mkdir()
        (env.FLASHINFER_JIT_DIR / name / f"{name}.so").write_bytes(b"")
    env.get_aot_artifacts = lambda n: ("prebuilt",) if aot and n == name else ()
    answer = X.fa3_module_ready()
    assert (answer is None) == ready
    if not ready:
        assert "not built" in answer
