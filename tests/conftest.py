"""Shared test setup, loaded by pytest before any test module.

Without a usable GPU, Triton kernels run on CPU tensors under the interpreter, which must be
switched on before anything imports triton (kdispatch.registry.discover() imports every kernel
module): it is set here, once, for the whole session, unless the caller chose TRITON_INTERPRET
already. GPU tests (tests/gpu/) run without it on a machine with CUDA.

Helpers the test modules import (`from conftest import ...`): `INTERPRETED`, `DEVICE`,
`kernel_module`, `official_definition`, `official_run`, `standalone_run`, `variant_cases`,
`runnable_variant`, `routed_to_baseline`.
"""
import importlib
import json
import os
from pathlib import Path

import pytest
import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"
OFFICIAL_DIR = Path(__file__).resolve().parents[2] / "shared" / "fib" / "definitions"


def pytest_collection_modifyitems(config, items):
    """KD_TEST_SHARD=i/n keeps every n-th collected test from the i-th: the GPU machine runs a long
    suite as n processes at once (benchmarks/retune.sh engines), its time being mostly compiles."""
    shard = os.environ.get("KD_TEST_SHARD")
    if not shard:
        return
    try:
        i, n = map(int, shard.split("/"))
        assert 0 <= i < n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"KD_TEST_SHARD must be i/n with 0 <= i < n, got {shard!r}") from None
    config.hook.pytest_deselected(items=[t for k, t in enumerate(items) if k % n != i])
    items[:] = items[i::n]


# Interpreted Triton costs seconds per call (every program runs in Python). A variant named here runs
# the CPU suites in one launch configuration on the definitions listed (its others differ only in
# launch constants, its other definitions only in the head count); tests/gpu/ runs them all.
INTERPRETED_ONLY = {"triton_prefill_chunked": {"gdn_prefill_pool_qk2_v4": "v64"},  # contest convention: test_gdn_chunked.py
                    "triton_prefill_fused": {"gdn_prefill_pool_qk2_v4": "c16v64"},  # contest convention: test_gdn_chunked.py
                    "triton_prefill_staged": {"gdn_prefill_pool_qk2_v4": "c16v64"},  # contest convention: test_gdn_chunked.py
                    "triton_decode_pool": {"gdn_decode_packed_qk2_v4": "v32w1"}}  # all: test_gdn_decode_pool_triton.py


@pytest.fixture(autouse=True, scope="session")
def _widest_recurrent_prefill_blocks():
    """Interpreted, the recurrent prefill's launch heuristic (the narrowest value block that keeps
    <= 2,048 programs: 2 rows, 1,024 programs for 2 sequences) costs ~15 s a call, the programs
    running one after another; its widest production block (8 rows) runs the same code in a quarter
    of the programs. tests/gpu/ runs the heuristic's own choices (test_gdn_triton.py checks it)."""
    if not INTERPRETED:
        yield
        return
    from kdispatch.kernels.triton.gdn import prefill_recurrent

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(prefill_recurrent, "prefill_config", lambda num_seqs, num_v_heads=8, head_v=128: (8, 1))
        yield


def interpreted_skip(v) -> str | None:
    """Why the CPU suites skip this variant under the interpreter (see INTERPRETED_ONLY), else None."""
    from kdispatch import definitions

    family, _, label = v.name.partition(".")
    if not (INTERPRETED and v.backend == "triton" and family in INTERPRETED_ONLY):
        return None
    if INTERPRETED_ONLY[family].get(definitions.get(v.definition).short) == label:
        return None
    return f"interpreted: {family} runs here as {INTERPRETED_ONLY[family]} only (tests/gpu/ runs all)"


def kernel_module(name: str):
    """Import a kernel module (e.g. "kdispatch.kernels.triton.gdn.decode_splitv") whose kernels run
    where the tensors live. Triton decides at decoration time whether a kernel is interpreted, so a
    module imported before TRITON_INTERPRET was set (by a plugin, say) holds compiled kernels that
    fail on CPU tensors: that is an error naming the cause here, not dozens of obscure failures."""
    module = importlib.import_module(name)
    if INTERPRETED:
        compiled = sorted(attr for attr, obj in vars(module).items() if _is_compiled_kernel(obj))
        if compiled:
            raise RuntimeError(f"{name} was imported before TRITON_INTERPRET=1 was set: {compiled} are "
                               "compiled, not interpreted; nothing may import kernel modules before "
                               "tests/conftest.py runs")
    return module


def _is_compiled_kernel(obj) -> bool:
    """A @triton.jit kernel that is not interpreted, looking through autotune/heuristics wrappers."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction, KernelInterface

    while isinstance(obj, KernelInterface) and not isinstance(obj, (JITFunction, InterpretedFunction)):
        obj = getattr(obj, "fn", None)
    return isinstance(obj, JITFunction)


def official_definition(short: str) -> dict:
    """The official FlashInfer-Bench definition JSON of `short` (../shared/fib beside the checkout);
    skips the test where it is absent."""
    from kdispatch import definitions

    name = definitions.resolve_name(short)
    hits = sorted(OFFICIAL_DIR.glob(f"*/{name}.json")) if OFFICIAL_DIR.is_dir() else []
    if not hits:
        pytest.skip(f"official definition {name} not found under {OFFICIAL_DIR}")
    return json.loads(hits[0].read_text())


def _run_of(text: str, label: str):
    namespace: dict = {}
    exec(compile(text, label, "exec"), namespace)  # definition references are plain modules
    return namespace["run"]


def official_run(short: str):
    """The official reference's `run`, executed from its JSON text in a fresh namespace."""
    return _run_of(official_definition(short)["reference"], f"<official {short}>")


def standalone_run(short: str):
    """kdispatch's reference `run`, executed from the definition JSON text as FlashInfer-Bench does."""
    from kdispatch import definitions

    return _run_of(definitions.load(short)["reference"], f"<kdispatch {short}>")


def variant_cases(shapes: dict):
    """pytest params (short, variant name, axes) for every variant of each definition in `shapes`
    ({short: [axes, ...]}) on each of its shapes."""
    from kdispatch import registry

    return [pytest.param(short, v.name, axes, id=f"{short}-{v.name}-{i}")
            for short, cases in shapes.items() for v in registry.variants(short) for i, axes in enumerate(cases)]


def runnable_variant(short: str, name: str, axes: dict):
    """The variant, or a skip saying why it cannot run this shape on this machine."""
    from kdispatch import arch, registry

    v = registry.get(short, name)
    why = v.why_not(arch.local_arch()) or v.declines(axes)
    if why is not None:
        pytest.skip(f"{name}: {why}")
    return v


def routed_to_baseline(monkeypatch, short: str, baseline: str):
    """`short`'s dispatcher routing every shape to a baseline variant named `baseline` that fails the
    test if it runs (a plugin hands such calls to the engine's own kernel), its remembered answers
    forgotten. Returns (dispatcher, the axes it was asked about); call its reset() when done."""
    from kdispatch import registry
    from kdispatch.ops import DISPATCHERS

    d = DISPATCHERS[short]
    engine = registry.Variant(d.definition, baseline, lambda *a: pytest.fail("kdispatch ran"), "library", ("*",),
                              baseline=True)
    asked = []
    monkeypatch.setattr(d, "choose", lambda arch, axes, mode="graph", strided=False: asked.append(axes) or engine)
    d.reset()
    return d, asked


def counted_layout_checks(monkeypatch, module, name: str) -> list:
    """A plugin's layout check `module.name` counted (one entry per run) with no layout remembered
    yet, on a machine taken as one where kdispatch serves (`serving.not_served`)."""
    from kdispatch.integrations import serving

    monkeypatch.setattr(serving, "not_served", lambda short, device: None)
    monkeypatch.setattr(serving, "_covered_layouts", {})
    checked = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *x: checked.append(1) or real(*x))
    return checked


def with_an_empty_sequence(short: str, args: list) -> list:
    """A prefill's arguments (any convention with `cu_seqlens`) with its last sequence that owns a
    state made empty, its tokens joined to the sequence before it, and its state continued (pool:
    has_initial_state set): the final state must be the initial one, untouched wherever the empty
    sequence starts (a chunked kernel's 64-token block bookkeeping once decayed it by its
    neighbour's gates)."""
    from kdispatch import definitions

    names = list(definitions.get(short).inputs)
    cu = args[names.index("cu_seqlens")]
    live = range(1, cu.shape[0] - 1)
    if "state_indices" in names:  # pool convention: a sequence on a real slot (not padding)
        slots, pool = args[names.index("state_indices")], args[names.index("state_pool")]
        live = [n for n in live if 0 <= int(slots[n]) < pool.shape[0]]
        args[names.index("has_initial_state")][live[-1]] = True
    n = live[-1]
    cu[n] = cu[n + 1]
    return args


INDEXER = "dsa_topk_indexer_fp8_h64_d128_topk2048_ps64"


def indexer_args(batch: int, max_pages: int, seed: int, num_pages: int = 160, tag: str = "idx") -> list:
    """Valid DSA indexer arguments (a list: tests replace some) for one shape."""
    from kdispatch import workloads

    return list(workloads.materialize(INDEXER, {"axes": {"batch_size": batch, "max_num_pages": max_pages,
                                                         "num_pages": num_pages},
                                                "inputs": {}, "uuid": f"{tag}-{batch}-{max_pages}"}, seed=seed))


def indexer_verdict(args, out):
    """The correctness gate's verdict on an indexer output for `args`."""
    from kdispatch.tuner import gate

    return gate.check_outputs(INDEXER, args, (out,), gate.reference(INDEXER, args))
