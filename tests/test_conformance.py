"""Every registered variant through the correctness gate on small materialised workloads.

Variants are discovered from the registry, so a newly registered one is covered without editing
this file. On the CPU: variants that run on any device, and Triton variants under the interpreter
(conftest.py switches it on); CUDA and library variants need a GPU (tests/gpu/test_gpu_conformance.py
runs every variant there). A shape the variant declines (`Variant.declines`) is skipped with its
reason.
"""
import os
from pathlib import Path

import pytest

from kdispatch import definitions, registry
from kdispatch.tuner import gate
from kdispatch.workloads import materialize

# Small shapes per definition (short name -> variable axes), cheap enough for the interpreter.
SMALL = {
    "gdn_decode": [{"batch_size": 1}, {"batch_size": 3}],
    "gdn_prefill": [{"total_seq_len": 1, "num_seqs": 1}, {"total_seq_len": 6, "num_seqs": 3}],
    "dsa_topk_indexer": [{"batch_size": 2, "max_num_pages": 3, "num_pages": 12},
                         {"batch_size": 1, "max_num_pages": 40, "num_pages": 60}],
    "dsa_sparse_attention": [{"num_tokens": 1, "num_pages": 40}, {"num_tokens": 2, "num_pages": 80}],
    "moe_fp8": [{"seq_len": 1}],
}
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Triton kernels at the MoE's real sizes (7168 x 4096 weights) take minutes in the interpreter;
# tests/test_moe_triton.py covers them at reduced sizes, tests/gpu/ at full size.
TOO_SLOW_INTERPRETED = {("moe_fp8", "triton")}


def runs_here(v: registry.Variant) -> str | None:
    """None when the variant can run in this process, else why not."""
    if v.missing:
        return "missing package " + ", ".join(v.missing)
    if v.backend == "triton" and INTERPRETED:
        return "too slow in the interpreter" if (definitions.get(v.definition).short, "triton") in \
            TOO_SLOW_INTERPRETED else None
    return v.why_not("cpu")


def cases():
    for d in definitions.all_definitions():
        for v in registry.variants(d.name):
            for i, axes in enumerate(SMALL.get(d.short, [])):
                yield pytest.param(d.short, v.name, axes, id=f"{d.short}-{v.name}-{i}")


@pytest.fixture(scope="module")
def trials():
    """(definition, axes) -> two gate trials, built once for every variant of that shape."""
    cache = {}

    def get(short, axes):
        key = (short, tuple(sorted(axes.items())))
        if key not in cache:
            w = {"uuid": f"conformance-{short}-{'-'.join(map(str, axes.values()))}", "axes": axes, "inputs": {}}
            out = []
            for t in range(2):
                args = list(materialize(short, gate.trial_workload(w, t)))
                out.append((args, gate.reference(short, args)))
            cache[key] = out
        return cache[key]

    return get


def test_every_definition_has_small_shapes_and_a_variant_checked_here():
    shipped = Path(definitions.__file__).parent
    assert set(SMALL) == {d.short for d in definitions.all_definitions() if d.path.is_relative_to(shipped)}
    for short in SMALL:
        assert any(runs_here(v) is None for v in registry.variants(short)), short


@pytest.mark.parametrize("short,name,axes", list(cases()))
def test_variant_passes_the_gate(short, name, axes, trials):
    v = registry.get(short, name)
    why = runs_here(v)
    if why is not None:
        pytest.skip(f"{name}: {why}")
    declined = v.declines(axes)
    if declined is not None:
        pytest.skip(f"{name} declines {axes}: {declined}")
    verdict = gate.run_gate(short, v.fn, trials(short, axes))
    assert verdict.passed, f"{short} {name} {axes}: {verdict.status} {verdict.reason}"
