"""Wrong and hostile input on the CPU: index values are padding (or a whole-batch no-op for
cu_seqlens) in every reference and every variant runnable here, the checked mode raises naming the
argument and position, scalar mistakes raise, the torch reference on a GPU says so, and the CLI
answers mistakes with one line and exit status 2."""
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import kdispatch
from conftest import interpreted_skip
from hostile import (GATHERED_PREFILL, INDEXED, MALFORMED_CU, PACKED, POOL_PREFILL, VERIFY, VERIFY_STEPS, WITH_CU,
                     hostile)
from kdispatch import registry
from kdispatch.dispatch import CHECK_VAR
from kdispatch.tuner import gate
from kdispatch.workloads import materialize, meta_arguments

REPO = Path(__file__).resolve().parents[1]
SHAPES = {
    "dsa_topk_indexer": [{"batch_size": 5, "max_num_pages": 20, "num_pages": 60},
                         {"batch_size": 4, "max_num_pages": 40, "num_pages": 60}],
    "dsa_sparse_attention": [{"num_tokens": 2, "num_pages": 40}],
    "gdn_prefill": [{"total_seq_len": 5, "num_seqs": 3}],  # interpreted Triton: ~2 s a token a call
    **{short: [{"batch_size": 9, "num_slots": 12}] for short in PACKED},
    **{short: [{"total_seq_len": 13, "num_seqs": 9, "num_slots": 12}] for short in POOL_PREFILL},
    **{short: [{"total_seq_len": 13, "num_seqs": 9}] for short in GATHERED_PREFILL},
    **{short: [{"num_seqs": 9, "cache_steps": 2, "total_seq_len": 18, "num_slots": 12, "num_cache_rows": 10}]
       for short in VERIFY},
    **{short: [{"num_seqs": 9, "num_steps": 2, "total_seq_len": 18, "num_slots": 19}] for short in VERIFY_STEPS},
}


def _args(short, axes, seed=0):
    return list(materialize(short, {"uuid": f"hostile-{short}-{seed}", "axes": axes, "inputs": {}}))


def _cases():
    for short in INDEXED:
        for v in registry.variants(short):
            if v.why_not("cpu") is not None and v.backend != "triton":  # Triton runs interpreted here
                continue
            if interpreted_skip(v):
                continue
            for i, axes in enumerate(SHAPES[short]):
                if v.declines(axes) is None:
                    yield pytest.param(short, v.name, axes, id=f"{short}-{v.name}-{i}")


@pytest.mark.parametrize("short,name,axes", list(_cases()))
def test_hostile_indices_follow_the_padding_rule(short, name, axes):
    v = registry.get(short, name)
    for seed in range(len(MALFORMED_CU) if short in WITH_CU else 3):
        args = hostile(short, _args(short, axes, seed), seed)
        verdict = gate.run_gate(short, v.fn, [(args, gate.reference(short, args))])
        assert verdict.passed, f"{name} seed {seed}: {verdict.status} {verdict.reason}"


def test_the_padding_rule_is_what_the_references_say():
    """Out-of-range entries equal explicit padding: the result does not depend on the wrong value."""
    from kdispatch.references import dsa_sparse_attention, dsa_topk_indexer, gdn_prefill

    args = _args("dsa_sparse_attention", SHAPES["dsa_sparse_attention"][0])
    bad = hostile("dsa_sparse_attention", args, 1)
    tokens = args[2].shape[0] * 64
    idx = bad[4]
    padded = [*bad[:4], torch.where((idx >= 0) & (idx < tokens), idx, -1), bad[5]]
    for x, y in zip(dsa_sparse_attention.run(*bad), dsa_sparse_attention.run(*padded)):
        assert torch.equal(x, y)

    args = _args("dsa_topk_indexer", SHAPES["dsa_topk_indexer"][1])
    bad = hostile("dsa_topk_indexer", args, 2)
    out = dsa_topk_indexer.run(*bad)
    table, num_pages = bad[4], bad[1].shape[0]
    allowed = {int(p) * 64 + s for p in table.flatten().tolist() if 0 <= p < num_pages for s in range(64)}
    assert set(out[out >= 0].tolist()) <= allowed  # no token of an out-of-range page is ever selected

    from kdispatch.references import gdn_decode_packed

    args = _args("gdn_decode_packed_qk4_v8", SHAPES["gdn_decode_packed_qk4_v8"][0])
    bad = hostile("gdn_decode_packed_qk4_v8", args, 1)
    idx = bad[6]
    assert bool(((idx < 0) | (idx >= 12)).any())
    padded = [*bad[:6], torch.where((idx >= 0) & (idx < 12), idx, -1), *bad[7:]]
    for x, y in zip(gdn_decode_packed.run(*bad), gdn_decode_packed.run(*padded)):
        assert torch.equal(x, y)

    args = _args("gdn_prefill", SHAPES["gdn_prefill"][0])
    for kind in MALFORMED_CU[1:]:
        bad = hostile("gdn_prefill", args, MALFORMED_CU.index(kind))
        out, state = gdn_prefill.run(*bad)
        assert not out.any() and torch.equal(state, bad[3]), kind


def test_no_reference_raises_for_any_int32_value():
    from kdispatch.references import dsa_sparse_attention, dsa_topk_indexer

    args = _args("dsa_topk_indexer", SHAPES["dsa_topk_indexer"][0])
    for fill in (-2**31, -1, 60, 2**31 - 1):
        dsa_topk_indexer.run(*args[:3], torch.full_like(args[3], fill), torch.full_like(args[4], fill))
    args = _args("dsa_sparse_attention", SHAPES["dsa_sparse_attention"][0])
    for fill in (-2**31, -2, 40 * 64, 2**31 - 1):
        out, lse = dsa_sparse_attention.run(*args[:4], torch.full_like(args[4], fill), args[5])
        assert not out.any() and bool(torch.isneginf(lse).all())


@pytest.fixture
def checked(monkeypatch):
    monkeypatch.setenv(CHECK_VAR, "1")
    for d in kdispatch.ops.DISPATCHERS.values():
        d.reload_switches()
    yield
    monkeypatch.delenv(CHECK_VAR)
    for d in kdispatch.ops.DISPATCHERS.values():
        d.reload_switches()


@pytest.mark.parametrize("short,corrupt,argument,where", [
    ("dsa_topk_indexer", lambda a: a[4].__setitem__((1, 0), -1), "block_table", "block_table[1, 0] = -1"),
    ("dsa_topk_indexer", lambda a: a[4].__setitem__((2, 0), 60), "block_table", "block_table[2, 0] = 60"),
    ("dsa_topk_indexer", lambda a: a[3].__setitem__(3, -4), "seq_lens", "seq_lens[3] = -4"),
    ("dsa_sparse_attention", lambda a: a[4].__setitem__((1, 7), -2), "sparse_indices", "sparse_indices[1, 7] = -2"),
    ("dsa_sparse_attention", lambda a: a[4].__setitem__((0, 3), 40 * 64), "sparse_indices", "sparse_indices[0, 3]"),
    ("gdn_prefill", lambda a: a[8].__setitem__(0, 1), "cu_seqlens", "cu_seqlens[0] = 1"),
    ("gdn_prefill", lambda a: a[8].__setitem__(1, 12), "cu_seqlens", "cu_seqlens[2] ="),
])
def test_checked_mode_names_the_argument_and_position(checked, short, corrupt, argument, where):
    args = _args(short, SHAPES[short][0])
    if short == "dsa_topk_indexer":
        args[3].fill_(64)  # every row reaches its first page
    getattr(kdispatch.ops, short)(*args)  # valid input passes the checked mode
    corrupt(args)
    with pytest.raises(ValueError, match=rf"argument '{argument}'.*{where}".replace("[", r"\[").replace("]", r"\]")):
        getattr(kdispatch.ops, short)(*args)


def test_scalar_mistakes_raise_on_every_call():
    args = _args("gdn_decode", {"batch_size": 2})
    with pytest.raises(ValueError, match="'scale' must be nonzero"):
        kdispatch.ops.gdn_decode(*args[:8], 0.0)
    args = _args("gdn_prefill", SHAPES["gdn_prefill"][0])
    with pytest.raises(ValueError, match="'scale' must be nonzero"):
        kdispatch.ops.gdn_prefill(*args[:9], 0.0)
    moe = kdispatch.ops.DISPATCHERS["moe_fp8"]
    fake = [None] * 8  # the scalar constraints run before any tensor is looked at
    for offset in (256, -16, 225):
        with pytest.raises(ValueError, match="local_expert_offset"):
            moe(*fake, offset, 2.5)
    for offset in (0, 224):
        moe.checker.check_scalars([*fake, offset, 2.5])
    tensors = meta_arguments("moe_fp8", {"seq_len": 1})[:8]
    for offset in (1.5, True, "1", None):  # a non-int would pass the range check
        with pytest.raises(ValueError, match="argument 'local_expert_offset' expected a finite Python int"):
            moe(*tensors, offset, 2.5)


def test_the_reference_on_a_gpu_says_so_once():
    d = kdispatch.ops.DISPATCHERS["dsa_sparse_attention"]
    d._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert d.choose("sm100", {"num_tokens": 4, "num_pages": 10}).name == "reference"
    msgs = [str(w.message) for w in caught if "torch reference" in str(w.message)]
    assert len(msgs) == 1 and "sm100" in msgs[0] and "no router for sm100" in msgs[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d.choose("cpu", {"num_tokens": 4, "num_pages": 10})
    assert not caught  # on the CPU the reference is what runs anyway


def _cli(*argv):
    return subprocess.run([sys.executable, "-m", "kdispatch.cli", *argv], capture_output=True, text=True, cwd=REPO)


@pytest.mark.parametrize("argv", [
    ("explain", "nosuch", "x=1"), ("explain", "gdn_decode", "batch_size=x"),
    ("tune", "--workloads", "/nonexistent", "--device", "cpu"),
    ("bench", "--workloads", "/nonexistent", "--device", "cpu"),
])
def test_cli_mistakes_are_one_line(argv):
    r = _cli(*argv)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_cli_route_never_creates_a_store(tmp_path):
    typo = tmp_path / "typo.sqlite"
    r = _cli("route", "--store", str(typo), "--out", str(tmp_path / "routers"))
    assert r.returncode == 2 and not typo.exists() and "no results store" in r.stderr


def test_cli_version():
    r = _cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"kdispatch {kdispatch.__version__}"


def test_finite_scalars_only():
    args = _args("gdn_decode", {"batch_size": 2})
    with pytest.raises(ValueError, match="scale"):
        kdispatch.ops.gdn_decode(*args[:8], math.nan)
