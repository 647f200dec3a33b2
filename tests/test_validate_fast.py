"""The generated fast check (validate.Checker._compile_fast) against the generic one: on valid calls
it answers, with the same axes; on every call the generic check rejects it answers None (so the
generic check raises its error); it is what `check` uses. The same for a remembered signature
(validate._Shapeless: a guard with the variable axes open, then the lean lines), at its own sizes
and at others."""
import math

import pytest
import torch

import kdispatch
from kdispatch import definitions, workloads

OPS = sorted(kdispatch.ops.DISPATCHERS)
CPU_SMALL = {  # real CPU tensors: the constraints that read values run (cu_seqlens[-1] == total_seq_len)
    "gdn_prefill": {"total_seq_len": 7, "num_seqs": 3},
    "gdn_prefill_pool_qk2_v4": {"total_seq_len": 9, "num_seqs": 4, "num_slots": 6},
    "gdn_verify_qk2_v4": {"num_seqs": 3, "cache_steps": 2, "total_seq_len": 6, "num_slots": 5, "num_cache_rows": 4},
    "gdn_decode_packed_qk2_v4": {"batch_size": 3, "num_slots": 5},
}
OTHER_DTYPE = {torch.float32: torch.bfloat16}


def meta_call(op, size=3):
    var = definitions.get(kdispatch.ops.DISPATCHERS[op].definition).var_axes
    return workloads.meta_arguments(kdispatch.ops.DISPATCHERS[op].definition,
                                    {a: size for a in var if a != "len_cu_seqlens"})


def cpu_call(op):
    d = kdispatch.ops.DISPATCHERS[op]
    return workloads.materialize(d.definition, workloads.SimpleWorkload(CPU_SMALL[op], uuid="fast-check"), "cpu")


def mutations(args):
    """Calls around a valid one: each tensor with another dtype, each of its sizes one larger,
    strided, on another device, missing, replaced by a number; each scalar of another type or
    non-finite; one argument too few or too many."""
    args = list(args)
    yield "too few", args[:-1]
    yield "too many", args + [1]
    for i, x in enumerate(args):
        def at(y, i=i):
            return args[:i] + [y] + args[i + 1:]

        if isinstance(x, torch.Tensor):
            yield f"{i} dtype", at(x.to(OTHER_DTYPE.get(x.dtype, torch.float32)))
            for j in range(x.dim()):
                shape = list(x.shape)
                shape[j] += 1
                yield f"{i} size {j}", at(torch.zeros(shape, dtype=x.dtype, device=x.device))
            if x.dim() >= 1 and x.numel() > 0:
                wide = torch.zeros([*x.shape[:-1], 2 * x.shape[-1]], dtype=x.dtype, device=x.device)
                yield f"{i} strided last dim", at(wide[..., ::2])
                if x.dim() >= 2:
                    tall = torch.zeros([2 * x.shape[0], *x.shape[1:]], dtype=x.dtype, device=x.device)
                    yield f"{i} strided rows", at(tall[::2])
            yield f"{i} device", at(x.to("meta") if x.device.type == "cpu" else torch.zeros(x.shape, dtype=x.dtype))
            yield f"{i} none", at(None)
            yield f"{i} number", at(1)
        else:
            for bad in (math.nan, math.inf, True, 1.5, 2, None, "1"):
                yield f"{i} {bad!r}", at(bad)


def agree(checker, label, args, answer=None):
    """`answer` (default: the generated fast check) rejects what the generic check rejects, and
    answers the generic check's axes where it answers."""
    fast = (answer or checker._fast)(args)
    try:
        want = checker._check(args)
    except ValueError:
        assert fast is None, f"{label}: the fast path accepts a call the generic check rejects"
        return
    assert fast is None or fast == want, f"{label}: {fast} != {want}"


@pytest.mark.parametrize("op", OPS)
def test_fast_check_answers_valid_calls_as_the_generic_one(op):
    c = kdispatch.ops.DISPATCHERS[op].checker
    args = meta_call(op)
    assert c._fast is not None and c._fast(args) == c._check(args) == c.check(args)


@pytest.mark.parametrize("op", OPS)
def test_fast_check_rejects_whatever_the_generic_one_rejects(op):
    c = kdispatch.ops.DISPATCHERS[op].checker
    for label, args in mutations(meta_call(op)):
        agree(c, label, args)


@pytest.mark.parametrize("op", sorted(CPU_SMALL))
def test_fast_check_on_cpu_values(op):
    c = kdispatch.ops.DISPATCHERS[op].checker
    args = list(cpu_call(op))
    assert c._fast(args) == c._check(args)
    for label, bad in mutations(args):
        agree(c, label, bad)
    names = [n for n, _ in c.inputs]
    if "cu_seqlens" in names:  # the value constraint: the boundaries' end must be the token count
        i = names.index("cu_seqlens")
        cu = args[i].clone()
        cu[-1] += 1
        bad = args[:i] + [cu] + args[i + 1:]
        with pytest.raises(ValueError):
            c._check(bad)
        assert c._fast(bad) is None


def test_fast_check_answers_strided_views_where_the_spec_allows_them():
    c = kdispatch.ops.DISPATCHERS["gdn_decode_packed_qk2_v4"].checker
    args = list(cpu_call("gdn_decode_packed_qk2_v4"))
    names = [n for n, _ in c.inputs]
    i = names.index("mixed_qkv")
    wide = torch.zeros(args[i].shape[0], 2 * args[i].shape[1], dtype=args[i].dtype)
    view = args[:i] + [wide[:, : args[i].shape[1]]] + args[i + 1:]
    assert not view[i].is_contiguous()
    assert c._fast(view) == c._check(view) is not None


def shapeless_of(checker, args):
    """The checker's remembered signature made from `args` (a valid call), as `check` keeps it."""
    from kdispatch.validate import _Shapeless

    return _Shapeless(checker, list(args))


def agree_shapeless(checker, known, label, args):
    agree(checker, label, args, lambda a: known.check(a, checker._lean))


@pytest.mark.parametrize("op", OPS)
def test_a_remembered_signature_takes_other_sizes_of_its_variable_axes(op):
    c = kdispatch.ops.DISPATCHERS[op].checker
    assert c._lean is not None
    known = shapeless_of(c, meta_call(op))
    other = meta_call(op, 5)
    assert known.check(other, c._lean) == c._check(other)  # answered, not sent to the full check
    c._shapeless.clear()
    assert c.check(meta_call(op)) == c._check(meta_call(op)) and len(c._shapeless) == 1  # remembered
    assert c.check(other) == c._check(other) and len(c._shapeless) == 1  # served by it


@pytest.mark.parametrize("op", OPS)
def test_a_remembered_signature_rejects_whatever_the_generic_check_rejects(op):
    c = kdispatch.ops.DISPATCHERS[op].checker
    for size in (3, 5):  # the signature's own sizes and others of its variable axes
        known = shapeless_of(c, meta_call(op))
        for label, args in mutations(meta_call(op, size)):
            agree_shapeless(c, known, f"size {size}, {label}", args)


@pytest.mark.parametrize("op", sorted(CPU_SMALL))
def test_a_remembered_signature_on_cpu_values(op):
    c = kdispatch.ops.DISPATCHERS[op].checker
    args = list(cpu_call(op))
    known = shapeless_of(c, args)
    assert known.check(args, c._lean) == c._check(args)
    for label, bad in mutations(args):
        agree_shapeless(c, known, label, bad)
    names = [n for n, _ in c.inputs]
    if "cu_seqlens" in names:  # the value constraint still runs on CPU tensors
        i = names.index("cu_seqlens")
        cu = args[i].clone()
        cu[-1] += 1
        assert known.check(args[:i] + [cu] + args[i + 1:], c._lean) is None


def test_a_remembered_signature_checks_contiguity_where_a_variable_axis_moves_the_strides():
    # the indexer's block table [batch, max_num_pages]: its row stride is the open axis
    op = "dsa_topk_indexer"
    c = kdispatch.ops.DISPATCHERS[op].checker
    names = [n for n, _ in c.inputs]
    i = names.index("block_table")
    known = shapeless_of(c, meta_call(op))
    args = list(meta_call(op, 5))
    x = args[i]
    wide = torch.zeros([x.shape[0], 2 * x.shape[1]], dtype=x.dtype, device=x.device)
    assert known.check(args[:i] + [wide[:, : x.shape[1]]] + args[i + 1:], c._lean) is None  # rows apart
    assert known.check(args, c._lean) == c._check(args)
