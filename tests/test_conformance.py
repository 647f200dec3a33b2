"""Every registered variant through the correctness gate on small materialised workloads.

Variants are discovered from the registry, so a newly registered one is covered without editing
this file. On the CPU: variants that run on any device, and Triton variants under the interpreter
(conftest.py switches it on); CUDA and library variants need a GPU (tests/gpu/test_gpu_conformance.py
runs every variant there). A shape the variant declines (`Variant.declines`) is skipped with its
reason.
"""
from pathlib import Path

import pytest

from conftest import INTERPRETED, interpreted_skip, kernel_module, with_an_empty_sequence
from kdispatch import definitions, registry
from kdispatch.tuner import gate
from kdispatch.workloads import materialize

# Small shapes per definition (short name -> variable axes), cheap enough for the interpreter.
SMALL = {
    "gdn_decode": [{"batch_size": 1}, {"batch_size": 3}],
    "gdn_prefill": [{"total_seq_len": 3, "num_seqs": 2}],  # interpreted: ~1.5 s a call per token
    "dsa_topk_indexer": [{"batch_size": 2, "max_num_pages": 3, "num_pages": 12},
                         {"batch_size": 1, "max_num_pages": 40, "num_pages": 60}],
    "dsa_sparse_attention": [{"num_tokens": 1, "num_pages": 40}, {"num_tokens": 2, "num_pages": 80}],
    "moe_fp8": [{"seq_len": 1}],  # its weights (32 experts of 7168 x 4096 FP8) take ~10 s to build
    **{f"gdn_decode_packed_qk{hq}_v{hv}": [{"batch_size": 1, "num_slots": 2}, {"batch_size": 9, "num_slots": 12}]
       for hq, hv in ((16, 32), (8, 16), (4, 8), (2, 4))},
    **{f"gdn_prefill_pool_qk{hq}_v{hv}": [{"total_seq_len": 11, "num_seqs": 9, "num_slots": 12}]
       for hq, hv in ((16, 32), (8, 16), (4, 8), (2, 4))},
    **{f"gdn_prefill_gathered_qk{hq}_v{hv}": [{"total_seq_len": 11, "num_seqs": 9}]
       for hq, hv in ((16, 32), (8, 16), (4, 8), (2, 4))},
    **{f"gdn_verify_qk{hq}_v{hv}": [{"num_seqs": 9, "cache_steps": 2, "total_seq_len": 18, "num_slots": 12,
                                     "num_cache_rows": 10}] for hq, hv in ((16, 32), (8, 16), (4, 8), (2, 4))},
    **{f"gdn_verify_steps_qk{hq}_v{hv}": [{"num_seqs": 9, "num_steps": 2, "total_seq_len": 18, "num_slots": 19}]
       for hq, hv in ((16, 32), (8, 16), (4, 8), (2, 4))},
}
# Interpreted Triton variants that take too long here: at seq_len 1 one MoE variant took 22-100 s
# for two trials (2 cores). tests/test_moe_triton.py runs them at reduced sizes, tests/gpu/ at full.
TOO_SLOW_INTERPRETED = {"moe_fp8": "too slow in the interpreter at full size (tests/test_moe_triton.py)"}


def runs_here(v: registry.Variant) -> str | None:
    """None when the variant can run in this process, else why not."""
    if v.missing:
        return "missing package " + ", ".join(v.missing)
    if v.backend == "triton" and INTERPRETED:
        return TOO_SLOW_INTERPRETED.get(definitions.get(v.definition).short) or interpreted_skip(v)
    return v.why_not("cpu")


def cases():
    for d in definitions.all_definitions():
        for v in registry.variants(d.name):
            for i in range(len(SMALL.get(d.short, []))):
                yield pytest.param(d.short, v.name, i, id=f"{d.short}-{v.name}-{i}")


@pytest.fixture(scope="module")
def trials():
    """(definition, shape index) -> two gate trials, built once for every variant of that shape."""
    cache = {}

    def get(short, i):
        if (short, i) not in cache:
            w = {"uuid": f"conf-{short}-{i}", "axes": SMALL[short][i], "inputs": {}}
            cache[short, i] = [(args, gate.reference(short, args)) for args in
                               (list(materialize(short, gate.trial_workload(w, t))) for t in range(2))]
        return cache[short, i]

    return get


def test_every_definition_has_small_shapes_and_a_variant_checked_here():
    assert registry.import_failures() == {}  # a kernel module that fails to import hides its variants
    shipped = Path(definitions.__file__).parent
    assert set(SMALL) == {d.short for d in definitions.all_definitions() if d.path.is_relative_to(shipped)}
    for short in SMALL:
        assert any(runs_here(v) is None for v in registry.variants(short)), short


@pytest.mark.parametrize("short,name,i", list(cases()))
def test_variant_passes_the_gate(short, name, i, trials):
    v, axes = registry.get(short, name), SMALL[short][i]
    why = runs_here(v)
    if why is not None:
        pytest.skip(f"{name}: {why}")
    declined = v.declines(axes)
    if declined is not None:
        pytest.skip(f"{name} declines {axes}: {declined}")
    if v.backend == "triton" and INTERPRETED:
        kernel_module(v.fn.__module__)  # says so if its kernels were compiled instead of interpreted
    verdict = gate.run_gate(short, v.fn, trials(short, i))
    assert verdict.passed, f"{short} {name} {axes}: {verdict.status} {verdict.reason}"


# The prefill conventions with an empty sequence that continues a state (a shape every convention
# allows; the trace sets have none): one head count each here, tests/gpu/ runs them all.
EMPTY_SEQUENCE = {"gdn_prefill": {"total_seq_len": 3, "num_seqs": 3},
                  "gdn_prefill_pool_qk2_v4": {"total_seq_len": 11, "num_seqs": 4, "num_slots": 6},
                  "gdn_prefill_gathered_qk2_v4": {"total_seq_len": 11, "num_seqs": 4}}


@pytest.mark.parametrize("short,name", [(s, v.name) for s in EMPTY_SEQUENCE for v in registry.variants(s)])
def test_prefill_keeps_an_empty_sequence_state(short, name):
    v, axes = registry.get(short, name), EMPTY_SEQUENCE[short]
    why = runs_here(v) or v.declines(axes)
    if why is not None:
        pytest.skip(f"{name}: {why}")
    w = {"uuid": f"conf-empty-{short}", "axes": axes, "inputs": {}}
    args = with_an_empty_sequence(short, list(materialize(short, w)))
    verdict = gate.run_gate(short, v.fn, [(args, gate.reference(short, args))])
    assert verdict.passed, f"{short} {name}: {verdict.status} {verdict.reason}"
