"""Bad input raises ValueError naming the argument, what was expected and what was given, before
any kernel runs (a poisoned variant proves no kernel ran)."""
import pytest
import torch

import kdispatch
from kdispatch import registry
from kdispatch.workloads import materialize, meta_arguments

SMALL = {
    "gdn_decode": {"batch_size": 2},
    "gdn_prefill": {"total_seq_len": 6, "num_seqs": 2, "len_cu_seqlens": 3},
    "dsa_topk_indexer": {"batch_size": 2, "max_num_pages": 3, "num_pages": 16},
    "dsa_sparse_attention": {"num_tokens": 2, "num_pages": 8},
    "moe_fp8": {"seq_len": 2},
}
NAMES = {
    "gdn_decode": ["q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "scale"],
    "gdn_prefill": ["q", "k", "v", "state", "A_log", "a", "dt_bias", "b", "cu_seqlens", "scale"],
    "dsa_topk_indexer": ["q_index_fp8", "k_index_cache_fp8", "weights", "seq_lens", "block_table"],
    "dsa_sparse_attention": ["q_nope", "q_pe", "ckv_cache", "kpe_cache", "sparse_indices", "sm_scale"],
    "moe_fp8": ["routing_logits", "routing_bias", "hidden_states", "hidden_states_scale", "gemm1_weights",
                "gemm1_weights_scale", "gemm2_weights", "gemm2_weights_scale", "local_expert_offset",
                "routed_scaling_factor"],
}


def meta_args(op):
    return meta_arguments(op, SMALL[op])


@pytest.fixture(autouse=True)
def no_kernel_may_run(monkeypatch):
    """Route every op on meta tensors to a variant that fails the test if it is ever called."""
    ran = []
    for op in SMALL:
        d = kdispatch.ops.DISPATCHERS[op]
        base = registry.baseline(d.definition, "meta")
        monkeypatch.setattr(base, "fn", lambda *a, _op=op: ran.append(_op))
        d.reset()
    yield ran
    for op in SMALL:
        kdispatch.ops.DISPATCHERS[op].reset()


def call(op, args):
    return getattr(kdispatch.ops.DISPATCHERS[op], "__call__")(*args)


@pytest.mark.parametrize("op", list(SMALL))
def test_valid_meta_arguments_pass(op, no_kernel_may_run):
    call(op, meta_args(op))
    assert no_kernel_may_run == [op]


@pytest.mark.parametrize("op", list(SMALL))
def test_wrong_dtype(op, no_kernel_may_run):
    args = meta_args(op)
    i = 0
    args[i] = args[i].to(torch.float16)
    with pytest.raises(ValueError, match=rf"argument '{NAMES[op][i]}' expected dtype .*got float16"):
        call(op, args)
    assert no_kernel_may_run == []


@pytest.mark.parametrize("op", list(SMALL))
def test_wrong_constant_axis(op, no_kernel_may_run):
    args = meta_args(op)
    t = args[0]
    args[0] = torch.empty(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype, device="meta")
    with pytest.raises(ValueError, match=rf"argument '{NAMES[op][0]}' expected .* = \d+ in shape"):
        call(op, args)
    assert no_kernel_may_run == []


@pytest.mark.parametrize("op", list(SMALL))
def test_inconsistent_variable_axis(op, no_kernel_may_run):
    # the first later argument whose leading axis is the first argument's (variable) leading axis
    args = meta_args(op)
    i = next(i for i, t in enumerate(args[1:], 1) if isinstance(t, torch.Tensor) and t.dim() > 1
             and t.shape[0] == args[0].shape[0])
    t = args[i]
    args[i] = torch.empty(t.shape[0] + 1, *t.shape[1:], dtype=t.dtype, device="meta")
    with pytest.raises(ValueError, match=rf"argument '{NAMES[op][i]}' expected .*\(from '{NAMES[op][0]}'\)"):
        call(op, args)


@pytest.mark.parametrize("op", list(SMALL))
def test_wrong_device(op, no_kernel_may_run):
    args = meta_args(op)
    args[1] = torch.empty(args[1].shape, dtype=args[1].dtype)  # CPU among meta tensors
    with pytest.raises(ValueError, match=rf"argument '{NAMES[op][1]}' expected device meta .*got device cpu"):
        call(op, args)


@pytest.mark.parametrize("op", list(SMALL))
def test_wrong_rank_and_type_and_count(op, no_kernel_may_run):
    args = meta_args(op)
    with pytest.raises(ValueError, match="expected .* arguments"):
        call(op, args[:-1])
    bad = list(args)
    bad[0] = bad[0][None]
    with pytest.raises(ValueError, match=rf"argument '{NAMES[op][0]}' expected \d dims"):
        call(op, bad)
    bad = list(args)
    bad[0] = [1, 2, 3]
    with pytest.raises(ValueError, match=rf"argument '{NAMES[op][0]}' expected a torch.Tensor"):
        call(op, bad)
    assert no_kernel_may_run == []


def test_non_contiguous():
    args = meta_args("gdn_decode")
    args[3] = torch.empty(2, 8, 128, 128, device="meta").transpose(2, 3)
    with pytest.raises(ValueError, match="argument 'state' expected a contiguous tensor"):
        call("gdn_decode", args)


def test_bad_scalars():
    args = meta_args("dsa_sparse_attention")
    args[-1] = "0.1"
    with pytest.raises(ValueError, match="argument 'sm_scale' expected a finite Python float"):
        call("dsa_sparse_attention", args)
    args[-1] = float("nan")
    with pytest.raises(ValueError, match="sm_scale"):
        call("dsa_sparse_attention", args)
    args = meta_args("moe_fp8")
    args[8] = 1.5
    with pytest.raises(ValueError, match="argument 'local_expert_offset' expected a finite Python int"):
        call("moe_fp8", args)


def test_cu_seqlens_length_must_be_num_seqs_plus_one():
    args = meta_args("gdn_prefill")
    args[8] = torch.empty(5, dtype=torch.int64, device="meta")  # 4 sequences, state holds 2
    with pytest.raises(ValueError, match=r"len_cu_seqlens == num_seqs \+ 1.*len_cu_seqlens=5 from 'cu_seqlens'"):
        call("gdn_prefill", args)


def test_cu_seqlens_total_checked_on_cpu(no_kernel_may_run):
    """Value constraints are checked where that needs no device sync (CPU tensors)."""
    args = materialize("gdn_prefill", {"axes": SMALL["gdn_prefill"], "inputs": {}, "uuid": "bad"}, device="cpu")
    args = list(args)
    args[8] = args[8].clone()
    args[8][-1] += 1
    with pytest.raises(ValueError, match=r"total_seq_len == cu_seqlens\[-1\]"):
        kdispatch.ops.gdn_prefill(*args)
