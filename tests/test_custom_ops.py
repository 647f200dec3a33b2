"""torch custom ops (kdispatch::<op>): schemas from the definitions, fake implementations with the
definitions' output shapes, torch.compile(fullgraph=True) matching eager calls with in-place state
updates kept, and kdispatch.ops.warmup routing and running both call modes' variants."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kdispatch
from kdispatch import custom_ops, definitions, registry, workloads
from kdispatch.registry import Variant

# small shapes the CPU reference runs quickly (MoE's weights are 1.4 GB: fake mode only)
SMALL = {
    "gdn_decode": {"batch_size": 3},
    "gdn_decode_packed_qk4_v8": {"batch_size": 9, "num_slots": 12},
    "gdn_prefill_pool_qk2_v4": {"total_seq_len": 13, "num_seqs": 9, "num_slots": 12},
    "gdn_verify_qk8_v16": {"num_seqs": 9, "cache_steps": 2, "total_seq_len": 18, "num_slots": 12, "num_cache_rows": 10},
    "gdn_verify_steps_qk2_v4": {"num_seqs": 9, "num_steps": 2, "total_seq_len": 18, "num_slots": 19},
    "gdn_prefill": {"total_seq_len": 20, "num_seqs": 3},
    "dsa_sparse_attention": {"num_tokens": 2, "num_pages": 40},
    "dsa_topk_indexer": {"batch_size": 2, "max_num_pages": 3, "num_pages": 8},
}


def small_args(op, seed=0, **axes):
    return workloads.materialize(op, workloads.SimpleWorkload({**SMALL[op], **axes}, uuid=f"co-{op}"), "cpu", seed)


def clone(args):
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in args]


def as_tuple(x):
    return () if x is None else x if isinstance(x, tuple) else (x,)


def test_schemas_mark_in_place_inputs_and_return_the_rest():
    packed = custom_ops.schema(definitions.get("gdn_decode_packed_qk4_v8"))
    assert "Tensor(a!) state_pool" in packed and "Tensor(b!) out" in packed and packed.endswith("-> ()")
    s = custom_ops.schema(definitions.get("gdn_decode"))
    assert "Tensor(a!) state" in s and s.endswith("-> Tensor") and "float scale" in s
    assert custom_ops.schema(definitions.get("dsa_sparse_attention")).endswith("-> (Tensor, Tensor)")
    assert "int local_expert_offset" in custom_ops.schema(definitions.get("moe_fp8"))
    for op in kdispatch.ops.DISPATCHERS:
        assert hasattr(torch.ops.kdispatch, op), op


@pytest.mark.parametrize("op", sorted(kdispatch.ops.DISPATCHERS))
def test_fake_outputs_have_the_definitions_shapes(op):
    d = definitions.get(op)
    axes = {"moe_fp8": {"seq_len": 5}}.get(op) or SMALL.get(op) or (
        {"total_seq_len": 7, "num_seqs": 3} if "prefill_gathered" in op else
        {"total_seq_len": 7, "num_seqs": 3, "num_slots": 5} if "prefill" in op else
        {"num_seqs": 3, "num_steps": 2, "total_seq_len": 6, "num_slots": 7} if "verify_steps" in op else
        {"num_seqs": 3, "cache_steps": 2, "total_seq_len": 6, "num_slots": 5, "num_cache_rows": 4} if "verify" in op
        else {"batch_size": 3, "num_slots": 5})
    meta = workloads.meta_arguments(op, axes)
    resolved = workloads.resolve_axes(op, axes)
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in meta]
        res = as_tuple(getattr(torch.ops.kdispatch, op)(*args))
    want = [o for o in d.outputs if o not in d.spec.in_place]
    assert len(res) == len(want)
    for name, r in zip(want, res):
        spec = d.data["outputs"][name]
        assert list(r.shape) == [resolved[a] for a in spec["shape"]], name
        assert r.dtype == workloads.DTYPES[spec["dtype"]], name


def test_the_custom_op_serves_the_dispatcher_and_writes_the_state():
    args = small_args("gdn_decode")
    a1, a2 = clone(args), clone(args)
    out, state = kdispatch.ops.gdn_decode(*a1)
    out2 = torch.ops.kdispatch.gdn_decode(*a2)
    torch.testing.assert_close(out2, out, rtol=0, atol=0)
    torch.testing.assert_close(a2[3], state, rtol=0, atol=0)
    assert not torch.equal(a2[3], args[3]), "the state was written in place"


class GraphRecorder:
    """A torch.compile backend that keeps the FX graphs it is given and runs them as they are."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def op_function(op):
    """The kdispatch.ops function of a definition (the packed decode ops share one, by head count)."""
    return (kdispatch.ops.gdn_decode_packed if op.startswith("gdn_decode_packed") else
            kdispatch.ops.gdn_prefill_pool if op.startswith("gdn_prefill_pool") else
            kdispatch.ops.gdn_verify_steps if op.startswith("gdn_verify_steps") else
            kdispatch.ops.gdn_verify if op.startswith("gdn_verify") else getattr(kdispatch.ops, op))


@pytest.mark.parametrize("op", sorted(SMALL))
def test_compiled_fullgraph_matches_eager(op):
    fn = op_function(op)
    rec = GraphRecorder()
    compiled = torch.compile(lambda *a: fn(*a), fullgraph=True, backend=rec)
    args = small_args(op)
    eager_args, compiled_args = clone(args), clone(args)
    want = as_tuple(fn(*eager_args))
    got = as_tuple(compiled(*compiled_args))
    assert rec.graphs and any(f"kdispatch.{op}" in str(n.target) for n in rec.graphs[0].graph.nodes), \
        "the compiled graph calls the custom op"
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=False)
    for c, e in zip(compiled_args, eager_args):  # in-place updates (the GDN state) happen in both
        if isinstance(c, torch.Tensor):
            torch.testing.assert_close(c, e, rtol=0, atol=0)
    d = definitions.get(op)
    for out, inp in d.spec.in_place.items():
        assert got[d.outputs.index(out)] is compiled_args[d.inputs.index(inp)], f"{out} is {inp}"


def test_a_hint_passes_through_the_compiled_custom_op():
    """gdn_prefill_pool's max_seq_len reaches the dispatcher from a torch.compile(fullgraph=True) graph
    (the schema's keyword-only `SymInt? max_seq_len`), and the results match the eager call's."""
    op = "gdn_prefill_pool_qk2_v4"
    d = kdispatch.ops.DISPATCHERS[op]
    seen = []
    d.set_router("cpu", lambda **axes: "reference", route_hinted=lambda max_seq_len, **axes: seen.append(max_seq_len)
                 or "reference")
    try:
        rec = GraphRecorder()
        compiled = torch.compile(lambda *a: kdispatch.ops.gdn_prefill_pool(*a[:9], out=a[9], max_seq_len=5),
                                 fullgraph=True, backend=rec)
        args = small_args(op)
        eager_args, compiled_args = clone(args), clone(args)
        got = compiled(*compiled_args)
        assert any(f"kdispatch.{op}" in str(n.target) for n in rec.graphs[0].graph.nodes)
        assert seen and set(seen) == {5}, "the compiled call routed with its hint"
        want = kdispatch.ops.gdn_prefill_pool(*eager_args[:9], out=eager_args[9], max_seq_len=5)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    finally:
        d.set_router("cpu", None)


def test_compiled_with_dynamic_shapes_follows_the_batch():
    compiled = torch.compile(lambda *a: kdispatch.ops.gdn_decode(*a), fullgraph=True, backend="aot_eager",
                             dynamic=True)
    for batch in (2, 5):
        args = small_args("gdn_decode", batch_size=batch)
        want_args, got_args = clone(args), clone(args)
        want = kdispatch.ops.gdn_decode(*want_args)
        got = compiled(*got_args)
        assert got[0].shape[0] == batch
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(got_args[3], want_args[3], rtol=0, atol=0)


@pytest.fixture
def two_mode_router():
    """gdn_decode on the CPU routed to one variant for captured calls and another for eager ones."""
    calls = []

    def tagged(tag):
        def run(q, k, v, state, *rest):
            calls.append(tag)
            return torch.zeros(q.shape[0], 1, 8, 128, dtype=torch.bfloat16), state
        return run

    registry.discover()
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    for tag in ("graph", "eager"):
        registry.register(Variant(d.definition, f"{tag}_tag", tagged(tag), "torch", ("cpu",)))
    d.set_router("cpu", lambda **axes: "graph_tag", lambda **axes: "eager_tag")
    yield calls
    d.set_router("cpu", None)
    for tag in ("graph", "eager"):
        registry.unregister(d.definition, f"{tag}_tag")


def test_warmup_routes_and_runs_each_call_modes_variant(two_mode_router):
    calls = two_mode_router
    assert kdispatch.warmup is kdispatch.ops.warmup  # the name the engines' integration code uses
    done = kdispatch.warmup("gdn_decode", [{"batch_size": 2}, {"batch_size": 7}], device="cpu")
    assert done == [({"batch_size": 2}, "graph_tag", "eager_tag"), ({"batch_size": 7}, "graph_tag", "eager_tag")]
    assert sorted(calls) == ["eager", "eager", "graph", "graph"]
    d = kdispatch.ops.DISPATCHERS["gdn_decode"]
    entries = sum(len(b) for b in d._entries.values())
    calls.clear()
    kdispatch.ops.gdn_decode(*small_args("gdn_decode", batch_size=7))
    assert calls == ["eager"] and sum(len(b) for b in d._entries.values()) == entries, \
        "a warmed signature is served from its cached decision"


def test_warmup_names_the_op_by_full_name_too():
    name = definitions.get("gdn_prefill").name
    [(axes, graph, eager)] = kdispatch.ops.warmup(name, [{"total_seq_len": 9, "num_seqs": 2}], device="cpu")
    assert axes == {"total_seq_len": 9, "num_seqs": 2, "len_cu_seqlens": 3}
    assert graph == eager == registry.REFERENCE
