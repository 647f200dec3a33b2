"""The shipped contest dataset (traces/) and input materialisation (kdispatch.workloads).

CPU only. The MoE weight test builds the shared ~1.4 GB of expert weights once (~10-15 s on two
cores); everything else is small or uses one shared pool per definition.
"""
import csv
import importlib.util
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdispatch import definitions
from kdispatch import workloads as W
from kdispatch.definitions.dsa_paged import spec as dsa_spec
from kdispatch.workloads import materialize

REPO = Path(__file__).resolve().parent.parent
TRACES = REPO / "traces"
AXES_DIR = REPO.parent / "shared" / "fib" / "contest-axes"
_build_spec = importlib.util.spec_from_file_location("traces_build", TRACES / "build.py")
traces_build = importlib.util.module_from_spec(_build_spec)
_build_spec.loader.exec_module(traces_build)
# the contest's definitions (the engine conventions have coverage and held-out sets only)
CONTEST = [n for n in definitions.names() if traces_build.is_contest(definitions.load(n))]
PAGE = 64
TOPK = 2048

SMALL = {
    "gdn_decode": {"batch_size": 2},
    "gdn_prefill": {"total_seq_len": 13, "num_seqs": 4, "len_cu_seqlens": 5},
    "dsa_topk_indexer": {"batch_size": 3, "max_num_pages": 5, "num_pages": 64},
    "dsa_sparse_attention": {"num_tokens": 3, "num_pages": 40},
}
COUNTS = {"moe_fp8": 19, "dsa_topk_indexer": 128, "dsa_sparse_attention": 23, "gdn_decode": 54, "gdn_prefill": 100}


def wl(axes, uuid="test-0", inputs=None):
    return {"axes": axes, "inputs": inputs or {}, "uuid": uuid}


def contest_workloads(short):
    """The shipped workloads of one definition as trace-line dicts."""
    defn = definitions.load(short)
    path = TRACES / "workloads" / defn["op_type"] / f"{defn['name']}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def same(a, b):
    """Bitwise equality of two argument tuples."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape
            if not torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x,
                               y.view(torch.uint8) if y.element_size() == 1 else y):
                return False
        elif x != y:
            return False
    return True


def bytes_of(t):
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t


# ------------------------------------------------------------------------------------------------
# Invariant checks (shared by the synthetic and the real contest workloads)
# ------------------------------------------------------------------------------------------------

def check_signature(short, axes, args):
    defn = definitions.load(short)
    full = {**{k: a["value"] for k, a in defn["axes"].items() if a["type"] == "const"}, **axes}
    if "num_seqs" in full:
        full.setdefault("len_cu_seqlens", full["num_seqs"] + 1)
    assert len(args) == len(defn["inputs"])
    named = {}
    for x, (name, spec) in zip(args, defn["inputs"].items()):
        if spec["shape"] is None:
            want = int if spec["dtype"].startswith("int") else float
            assert type(x) is want, (name, x)
        else:
            assert isinstance(x, torch.Tensor), name
            assert list(x.shape) == [full[a] for a in spec["shape"]], (name, x.shape)
            assert x.dtype == getattr(torch, spec["dtype"]), (name, x.dtype)
            assert x.is_contiguous(), name
            if x.dtype == torch.float8_e4m3fn:  # NaN is S.1111.111; checked on bytes, no fp32 copy
                assert not ((x.view(torch.uint8) & 0x7F) == 0x7F).any(), f"{name} has NaN"
            elif x.dtype.is_floating_point:
                assert torch.isfinite(x).all(), f"{name} has NaN/Inf"
        named[name] = x
    return named


def check_gdn(short, axes, args):
    x = check_signature(short, axes, args)
    for name in ("q", "k"):
        norms = x[name].float().norm(dim=-1)
        assert torch.allclose(norms, torch.ones_like(norms), atol=1e-2), f"{name} not L2-normalised"
    assert 0.05 < x["state"].std() < 1.0 and x["state"].abs().max() < 10
    assert (x["A_log"] >= 0).all() and (x["A_log"] <= math.log(16) + 1e-6).all()
    dt = torch.nn.functional.softplus(x["dt_bias"])
    assert (dt > 0.9e-3).all() and (dt < 0.11).all()
    assert x["scale"] == pytest.approx(1 / math.sqrt(128))
    if "cu_seqlens" in x:
        cu = x["cu_seqlens"]
        assert cu.dtype == torch.int64 and cu.shape[0] == axes["num_seqs"] + 1
        assert int(cu[0]) == 0 and int(cu[-1]) == axes["total_seq_len"]
        assert (cu.diff() >= 1).all(), "empty sequence"
    return x


def check_indexer(axes, args):
    x = check_signature("dsa_topk_indexer", axes, args)
    b, p, n = axes["batch_size"], axes["max_num_pages"], axes["num_pages"]
    lens, table = x["seq_lens"].long(), x["block_table"].long()
    assert (lens >= 1).all() and (lens <= p * PAGE).all()
    assert (int(lens.max()) + PAGE - 1) // PAGE == p, "longest sequence does not reach the last page"
    assert (table >= 0).all() and (table < n).all()
    used = (lens + PAGE - 1) // PAGE
    used_pages = torch.cat([table[i, : int(used[i])] for i in range(b)])
    assert used_pages.unique().numel() == used_pages.numel(), "a page is shared by two sequences"
    if b * p <= n:
        assert table.unique().numel() == b * p, "block-table pages not distinct"
    # Real per-token quantisation: finite e4m3 bytes, each key uses the full range, positive scales.
    cache = x["k_index_cache_fp8"]
    raw = cache.view(torch.uint8).reshape(n, PAGE * 132)
    vals = raw[:, : PAGE * 128]
    assert not ((vals & 0x7F) == 0x7F).any(), "NaN bytes in the key cache"
    scale = raw[:, PAGE * 128:].contiguous().view(torch.float32)
    assert (scale > 0).all() and torch.isfinite(scale).all()
    amax = vals.contiguous().view(torch.float8_e4m3fn).float().view(n, PAGE, 128).abs().amax(-1)
    assert (amax == 448).all()
    q = x["q_index_fp8"].float()
    assert (q.abs().amax(-1) == 448).all(), "queries not quantised per (token, head)"
    assert (x["weights"].abs() < 1).all() and x["weights"].abs().max() > 0
    return x


def check_indexer_output(x, topk_indices):
    """The reference's ids are reachable (in the sequence's pages, inside its length), distinct,
    and there are min(len, 2048) of them."""
    lens, table = x["seq_lens"].long(), x["block_table"].long()
    for i in range(lens.shape[0]):
        row = topk_indices[i].long()
        valid = row[row >= 0]
        assert valid.numel() == min(int(lens[i]), TOPK)
        assert (row[valid.numel():] == -1).all()
        assert valid.unique().numel() == valid.numel()
        pos = {int(pg): j for j, pg in enumerate(table[i, : (int(lens[i]) + PAGE - 1) // PAGE])}
        for tok in valid.tolist():
            j = pos.get(tok // PAGE)
            assert j is not None and j * PAGE + tok % PAGE < int(lens[i])


def check_sparse(axes, args):
    x = check_signature("dsa_sparse_attention", axes, args)
    t, n = axes["num_tokens"], axes["num_pages"]
    idx = x["sparse_indices"].long()
    padded = 0
    for r in range(t):
        row = idx[r]
        k = int((row >= 0).sum())
        assert k >= 1, "a row without any token"
        assert (row[:k] >= 0).all() and (row[k:] == -1).all(), "-1 padding not at the tail"
        assert (row[:k] < n * PAGE).all()
        assert row[:k].unique().numel() == k, "duplicate token in a row"
        padded += k < TOPK
    if t >= 2:
        assert padded >= 1, "no -1 padded row"
    if n * PAGE < TOPK:
        assert padded == t
    assert x["sm_scale"] == pytest.approx(1 / math.sqrt(192))
    for name in ("q_nope", "q_pe", "ckv_cache", "kpe_cache"):
        assert 0.5 < x[name].float().std() < 2
    return x


# ------------------------------------------------------------------------------------------------
# traces/
# ------------------------------------------------------------------------------------------------

def test_trace_set_loads_every_contest_workload():
    from flashinfer_bench.data import TraceSet

    ts = TraceSet.from_path(str(TRACES))
    assert sorted(ts.definitions) == sorted(CONTEST)
    assert sum(len(v) for v in ts.workloads.values()) == 324
    for short, n in COUNTS.items():
        full = definitions.resolve_name(short)
        traces = ts.workloads[full]
        assert len(traces) == n
        assert all(t.is_workload_trace() for t in traces)
        assert len({t.workload.uuid for t in traces}) == n
        for t in traces:
            assert set(t.workload.inputs) == set(definitions.load(short)["inputs"])
            for name, value in definitions.get(full).spec.model_scalars.items():
                assert t.workload.inputs[name].type == "scalar" and t.workload.inputs[name].value == value
    assert ts.workloads[definitions.resolve_name("moe_fp8")][0].workload.inputs["local_expert_offset"].value == 0


@pytest.mark.skipif(not AXES_DIR.is_dir(), reason="contest axes not available")
def test_every_csv_workload_is_shipped_with_its_axes():
    for name in CONTEST:
        var = [k for k, a in definitions.load(name)["axes"].items() if a["type"] == "var"]
        with (AXES_DIR / f"{name}.csv").open(newline="") as f:
            want = {r["uuid"]: {k: int(r[k]) for k in var} for r in csv.DictReader(f)}
        got = {t["workload"]["uuid"]: t["workload"]["axes"] for t in contest_workloads(name)}
        assert got == want, name


@pytest.mark.skipif(not AXES_DIR.is_dir(), reason="contest axes not available")
def test_build_is_deterministic_and_shipped_files_are_current(tmp_path):
    build = traces_build
    counts = build.build(AXES_DIR, tmp_path)
    built = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    shipped = sorted(p.relative_to(TRACES) for root in ("", *build.SAMPLED_SETS) for pattern in build.DATASET_FILES
                     for p in (TRACES / root).glob(pattern))
    assert built == shipped
    assert all(counts[s] for s in build.SAMPLED_SETS)
    for rel in built:
        assert (tmp_path / rel).read_bytes() == (TRACES / rel).read_bytes(), \
            f"traces/{rel} is stale: rerun python traces/build.py"


def test_coverage_and_heldout_sets_span_the_spec_ranges():
    seen = {w.uuid for name in definitions.names() for w in W.load_workloads(TRACES, name)}
    for which in ("coverage", "heldout"):
        for name in definitions.names():
            cov = definitions.get(name).spec.coverage
            if cov is None:
                continue
            ws = W.load_workloads(TRACES / which, name)
            grids = (cov.grid, *cov.more_grids) if which == "coverage" else ()
            grid = [dict(zip(g, v)) for g in grids if g for v in itertools.product(*g.values())]
            def per_grid_shape(g):  # every mix, where the mixes differ
                return len(cov.mixes) if cov.grid_every_mix and not (cov.one_mix and cov.one_mix(g)) else 1

            # the grids add the shapes not drawn or added already (a one-axis log grid shares its ends
            # with the draws)
            drawn = [w.axes for w in ws[:cov.points]]
            added = []
            for g in grid:
                if cov.complete(dict(g)) is not None and cov.complete(dict(g)) not in drawn + added:
                    added.append(cov.complete(dict(g)))
            assert len(ws) == (cov.points + sum(map(per_grid_shape, added)) if which == "coverage" else cov.heldout), \
                (which, name)
            for g in added:  # every grid shape not drawn before is there, in each mix
                found = [w for w in ws if all(w.axes[k] == v for k, v in g.items())]
                assert len(found) == per_grid_shape(g), (name, g)
            uuids = {w.uuid for w in ws}
            assert len(uuids) == len(ws) and not uuids & seen, "uuids repeat within or across sets"
            seen |= uuids
            for axis, (lo, hi) in cov.ranges.items():
                values = [w.axes[axis] for w in ws]
                assert lo <= min(values) and max(values) <= hi, (which, name, axis)
                if which == "coverage":  # the grid or the corners reach both ends
                    assert (min(values), max(values)) == (lo, hi), (name, axis)
            for w in ws:
                assert cov.complete(dict(w.axes)) == dict(w.axes)


def test_prefill_coverage_has_one_and_two_sequence_prompts_once_per_mix():
    """A prompt or two of 100-1,000 tokens, the commonest prefill, is on every prefill's coverage grid;
    one sequence is the same workload in every length mix, so it is there once."""
    for name in definitions.names():
        cov = definitions.get(name).spec.coverage
        if cov is None or "num_seqs" not in cov.ranges or "total_seq_len" not in cov.ranges:
            continue
        ws = W.load_workloads(TRACES / "coverage", name)
        grid_ws = ws[cov.points:]
        for n in (1, 2):
            lengths = sorted({w.axes["total_seq_len"] for w in grid_ws if w.axes["num_seqs"] == n})
            assert any(100 <= t <= 1024 for t in lengths), (name, n, lengths)
        one = [w.axes["total_seq_len"] for w in grid_ws if w.axes["num_seqs"] == 1]
        assert one and len(one) == len(set(one)), (name, one)
        assert cov.one_mix({"num_seqs": 1}) and not cov.one_mix({"num_seqs": 2})


def test_prefill_coverage_mixes_are_valid_partitions():
    ws = W.load_workloads(TRACES / "coverage", "gdn_prefill")
    stored = [w for w in ws if "safetensors" in str(w.inputs.get("cu_seqlens"))]
    assert stored, "no skewed or equal mixes"
    for w in ws:
        if w.axes["total_seq_len"] > 4096:
            continue
        args = dict(zip(definitions.get("gdn_prefill").inputs,
                        W.materialize("gdn_prefill", w, trace_root=TRACES / "coverage")))
        cu, total, n = args["cu_seqlens"], w.axes["total_seq_len"], w.axes["num_seqs"]
        lens = cu[1:] - cu[:-1]
        assert cu.shape[0] == n + 1 and int(cu[0]) == 0 and int(cu[-1]) == total and bool((lens >= 1).all())


def test_pool_prefill_hint_is_the_longest_sequence_materialised():
    """The spec's call-time hint (max_seq_len) agrees with the cu_seqlens and slots `materialize`
    gives: the longest live sequence (padding rows, slot -1, left out), for stored (skewed, equal)
    and drawn (random) length mixes alike; some workloads have their longest row in the padding."""
    name = "gdn_prefill_pool_qk4_v8_d128_k_last"
    ws = [w for w in W.load_workloads(TRACES / "coverage", name) if w.axes["total_seq_len"] <= 2048]
    kinds, padded_longest = set(), 0
    for w in ws:
        args = dict(zip(definitions.get(name).inputs, W.materialize(name, w, trace_root=TRACES / "coverage")))
        cu, slots = args["cu_seqlens"].to(torch.int64), args["state_indices"]
        lens = cu[1:] - cu[:-1]
        assert W.hint_values(name, w, trace_root=TRACES / "coverage") == {"max_seq_len": int(lens[slots >= 0].max())}
        padded_longest += int(lens[slots >= 0].max() < lens.max())
        kinds.add("safetensors" in str(w.inputs.get("cu_seqlens")))
    assert kinds == {True, False} and padded_longest > 0
    assert W.hint_values("gdn_decode", ws[0]) == {}  # a definition without hints
    for w in W.load_workloads(TRACES / "coverage", "gdn_prefill")[:12]:  # the contest convention's hint
        args = dict(zip(definitions.get("gdn_prefill").inputs,
                        W.materialize("gdn_prefill", w, trace_root=TRACES / "coverage")))
        lens = args["cu_seqlens"][1:] - args["cu_seqlens"][:-1]
        assert W.hint_values("gdn_prefill", w, trace_root=TRACES / "coverage") == {"max_seq_len": int(lens.max())}


def test_shipped_definitions_are_the_kdispatch_definitions():
    for name in definitions.names():
        d = definitions.load(name)
        sampled = [TRACES / s for s in traces_build.SAMPLED_SETS] if definitions.get(name).spec.coverage else []
        for root in ([TRACES] if name in CONTEST else []) + sampled:
            assert (root / "definitions" / d["op_type"] / f"{name}.json").read_bytes() == \
                definitions.path(name).read_bytes(), "stale copy: rerun python traces/build.py"
    assert len(CONTEST) == 5


def test_load_workloads_with_and_without_flashinfer_bench(monkeypatch):
    ws = W.load_workloads(TRACES, "dsa_topk_indexer")
    assert len(ws) == 128 and type(ws[0]).__name__ == "Workload"
    monkeypatch.setitem(sys.modules, "flashinfer_bench.data", None)  # import now fails
    plain = W.load_workloads(TRACES, "dsa_topk_indexer")
    assert isinstance(plain[0], W.SimpleWorkload)
    assert [(w.uuid, w.axes) for w in plain] == [(w.uuid, dict(w.axes)) for w in ws]
    assert plain[0].inputs["seq_lens"] == {"type": "random"}


def test_module_does_not_import_flashinfer_bench():
    code = "import sys, kdispatch.workloads; sys.exit('flashinfer_bench' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ------------------------------------------------------------------------------------------------
# Synthetic workloads
# ------------------------------------------------------------------------------------------------

def test_gdn_decode_small():
    check_gdn("gdn_decode", SMALL["gdn_decode"], materialize("gdn_decode", wl(SMALL["gdn_decode"])))


def test_gdn_prefill_small_and_partition_variety():
    check_gdn("gdn_prefill", SMALL["gdn_prefill"], materialize("gdn_prefill", wl(SMALL["gdn_prefill"])))
    lengths = set()
    for i in range(20):
        axes = {"total_seq_len": 40, "num_seqs": 1 + i % 6}
        x = check_gdn("gdn_prefill", axes, materialize("gdn_prefill", wl(axes, f"p{i}")))
        lengths |= set(x["cu_seqlens"].diff().tolist())
    assert min(lengths) == 1 and max(lengths) >= 30
    # every token its own sequence
    x = materialize("gdn_prefill", wl({"total_seq_len": 5, "num_seqs": 5}))
    assert x[8].tolist() == [0, 1, 2, 3, 4, 5]


def test_indexer_small_runs_through_reference():
    from kdispatch.references import dsa_topk_indexer as ref

    axes = SMALL["dsa_topk_indexer"]
    x = check_indexer(axes, materialize("dsa_topk_indexer", wl(axes)))
    check_indexer_output(x, ref.run(*x.values()))
    # a pool too small for distinct padding columns: used pages stay distinct
    axes = {"batch_size": 4, "max_num_pages": 6, "num_pages": 12}
    for i in range(5):
        check_indexer(axes, materialize("dsa_topk_indexer", wl(axes, f"tight{i}")))
    with pytest.raises(ValueError, match="pool"):
        materialize("dsa_topk_indexer", wl({"batch_size": 4, "max_num_pages": 6, "num_pages": 8}))


def test_index_cache_layout_round_trip():
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(3, PAGE, 128, generator=g) * torch.rand(3, PAGE, 1, generator=g) * 4
    cache = dsa_spec.quantize_index_keys(keys)
    assert cache.shape == (3, PAGE, 1, 132) and cache.dtype == torch.int8
    deq = dsa_spec.dequantize_index_cache(cache)
    scale = keys.abs().amax(-1, keepdim=True) / 448
    assert ((deq - keys).abs() <= keys.abs() / 16 + scale * 2 ** -9 + 1e-12).all()
    # the deep_gemm byte layout itself: page p = [64 x 128 fp8 keys, token-major][64 x fp32 scales]
    raw = cache.view(torch.uint8).reshape(3, PAGE * 132)
    p, t = 2, 37
    key_t = raw[p, t * 128:(t + 1) * 128].contiguous().view(torch.float8_e4m3fn).float()
    scale_t = raw[p, PAGE * 128 + 4 * t: PAGE * 128 + 4 * t + 4].contiguous().view(torch.float32)
    assert torch.allclose(key_t * scale_t, deq[p, t])
    assert scale_t.item() == pytest.approx(scale[p, t].item(), rel=1e-6)


def test_sparse_attention_small_runs_through_reference():
    from kdispatch.references import dsa_sparse_attention as ref

    axes = SMALL["dsa_sparse_attention"]
    x = check_sparse(axes, materialize("dsa_sparse_attention", wl(axes)))
    out, lse = ref.run(*x.values())
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()
    # a pool under 2048 tokens: every row padded; many rows: full rows and short ones
    check_sparse({"num_tokens": 4, "num_pages": 8}, materialize("dsa_sparse_attention",
                                                               wl({"num_tokens": 4, "num_pages": 8})))
    axes = {"num_tokens": 16, "num_pages": 40}
    x = check_sparse(axes, materialize("dsa_sparse_attention", wl(axes, "many")))
    valid = (x["sparse_indices"] >= 0).sum(1)
    assert (valid == TOPK).any() and (valid < TOPK).any()


def test_determinism_per_uuid_and_seed():
    for short, axes in SMALL.items():
        a = materialize(short, wl(axes, "u1"), seed=3)
        W.clear_cache()  # pools are rebuilt identically
        b = materialize(short, wl(axes, "u1"), seed=3)
        assert same(a, b), short
        c = materialize(short, wl(axes, "u1"), seed=4)
        d = materialize(short, wl(axes, "u2"), seed=3)
        for name, x, y, z in zip(definitions.load(short)["inputs"], a, c, d):
            if not isinstance(x, torch.Tensor):
                continue
            assert not torch.equal(bytes_of(x), bytes_of(y)), f"{short}.{name}: seed ignored"
            if name not in ("ckv_cache", "kpe_cache", "k_index_cache_fp8"):  # pools: per seed only
                assert not torch.equal(bytes_of(x), bytes_of(z)), f"{short}.{name}: uuid ignored"


def test_large_normal_draws_are_parallel_and_independent_of_the_thread_count(monkeypatch):
    """workloads.randn: a large tensor is drawn in chunks on several threads, its bytes the same
    whatever the thread count; a small one is torch.randn's own; each chunk holds N(0, 1) values."""
    monkeypatch.setattr(W, "RANDN_CHUNK", 1000)

    def draw(threads, *shape, dtype=torch.float32):
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        return W.randn(*shape, generator=torch.Generator().manual_seed(7), dtype=dtype)

    one, four = draw(1, 10, 1_234), draw(4, 10, 1_234)
    assert one.shape == (10, 1_234) and torch.equal(one, four)
    assert not torch.equal(one.view(-1)[:1000], one.view(-1)[1000:2000])  # chunks from distinct seeds
    for chunk in one.view(-1).split(1000):
        assert abs(chunk.mean()) < 0.15 and 0.85 < chunk.std() < 1.15
    assert torch.equal(draw(3, 10, 1_234, dtype=torch.bfloat16), one.to(torch.bfloat16))
    assert torch.equal(draw(2, 999), torch.randn(999, generator=torch.Generator().manual_seed(7)))
    g = torch.Generator().manual_seed(7)
    W.randn(5_000, generator=g)  # the parent generator moves on: the next draw differs
    assert not torch.equal(W.randn(5_000, generator=g), draw(1, 5_000))


def test_sparse_indices_rows_do_not_depend_on_the_thread_count(monkeypatch):
    rows = []
    for threads in (1, 3):
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
        rows.append(dsa_spec.random_sparse_indices(40, 300, 64, 2048, torch.Generator().manual_seed(5)))
    assert torch.equal(*rows)
    assert not torch.equal(rows[0][0], rows[0][1])


def test_workload_forms_and_names_agree():
    from flashinfer_bench.data import Trace

    line = contest_workloads("gdn_decode")[0]
    ref = materialize("gdn_decode", line["workload"])
    assert same(ref, materialize("gdn_decode", line))
    assert same(ref, materialize(definitions.resolve_name("gdn_decode"), Trace.model_validate(line)))
    assert same(ref, materialize(definitions.load("gdn_decode"), Trace.model_validate(line).workload))
    assert same(ref, materialize(definitions.as_fib("gdn_decode"), line))
    ids = [uuid for uuid, _ in W.materialize_all("gdn_decode", TRACES)]
    assert ids == [t["workload"]["uuid"] for t in contest_workloads("gdn_decode")]


def test_scalars_default_to_model_values_and_given_ones_win():
    args = materialize("gdn_decode", wl({"batch_size": 1}))
    assert args[-1] == 1 / math.sqrt(128)
    args = materialize("gdn_decode", wl({"batch_size": 1}, inputs={"scale": {"type": "scalar", "value": 0.5}}))
    assert args[-1] == 0.5
    assert materialize("dsa_sparse_attention", wl({"num_tokens": 1, "num_pages": 2}))[-1] == 1 / math.sqrt(192)


def test_bad_workloads_are_refused():
    with pytest.raises(ValueError, match="lacks the axes"):
        materialize("dsa_topk_indexer", wl({"batch_size": 2}))
    with pytest.raises(ValueError, match="len_cu_seqlens"):
        materialize("gdn_prefill", wl({"total_seq_len": 4, "num_seqs": 2, "len_cu_seqlens": 4}))
    with pytest.raises(ValueError, match="non-empty"):
        materialize("gdn_prefill", wl({"total_seq_len": 2, "num_seqs": 3}))
    with pytest.raises(ValueError, match="not inputs"):
        materialize("gdn_decode", wl({"batch_size": 1}, inputs={"bogus": {"type": "random"}}))
    with pytest.raises(ValueError, match="unknown definition"):
        materialize("nope", wl({}))


def test_safetensors_inputs_are_loaded(tmp_path):
    from safetensors.torch import save_file

    (tmp_path / "blob").mkdir()
    lens = torch.tensor([5, 300, 64], dtype=torch.int32)  # longest (300) on page 5 of 5
    cu = torch.tensor([0, 2, 3, 13], dtype=torch.int64)
    save_file({"lens": lens, "cu": cu}, str(tmp_path / "blob" / "w.safetensors"))
    axes = SMALL["dsa_topk_indexer"]
    stored = {"seq_lens": {"type": "safetensors", "path": "blob/w.safetensors", "tensor_key": "lens"}}
    x = check_indexer(axes, materialize("dsa_topk_indexer", wl(axes, inputs=stored), trace_root=tmp_path))
    assert torch.equal(x["seq_lens"], lens)
    # a flashinfer_bench Workload, absolute path, and a dependent input (cu_seqlens fixes the split)
    from flashinfer_bench.data import Workload

    w = Workload(axes={"total_seq_len": 13, "num_seqs": 3, "len_cu_seqlens": 4}, uuid="st",
                 inputs={"cu_seqlens": {"type": "safetensors", "path": str(tmp_path / "blob" / "w.safetensors"),
                                        "tensor_key": "cu"}})
    x = check_gdn("gdn_prefill", dict(w.axes), materialize("gdn_prefill", w))
    assert torch.equal(x["cu_seqlens"], cu)
    with pytest.raises(ValueError, match="expected shape"):
        bad = {"seq_lens": {"type": "safetensors", "path": "blob/w.safetensors", "tensor_key": "cu"}}
        materialize("dsa_topk_indexer", wl(axes, inputs=bad), trace_root=tmp_path)


def test_moe_inputs_and_shared_weights():
    from kdispatch.references import moe_fp8 as ref
    from kdispatch.references.moe_fp8 import _route

    axes = {"seq_len": 2}
    args = materialize("moe_fp8", wl(axes))
    x = check_signature("moe_fp8", axes, args)
    assert x["local_expert_offset"] == 0 and x["routed_scaling_factor"] == 2.5
    assert x["routing_bias"].abs().max() < 0.5
    hs = x["hidden_states"].float().view(2, 56, 128)
    assert (hs.abs().amax(-1) == 448).all(), "activations not block-quantised"
    assert (x["hidden_states_scale"] > 0).all()
    deq = hs * x["hidden_states_scale"].t()[:, :, None]
    assert 0.5 < deq.std() < 3
    e0 = x["gemm1_weights"][0].float().view(32, 128, 56, 128)
    assert (e0.abs().amax(dim=(1, 3)) == 448).all(), "weights not block-quantised"
    for name in ("gemm1_weights_scale", "gemm2_weights_scale"):
        s = x[name]
        assert (s > 1e-5).all() and (s < 1e-3).all()
    experts, _ = _route(x["routing_logits"], x["routing_bias"], 2.5)
    assert (experts < 32).any(), "no token reaches a local expert"
    out = ref.run(*args)
    assert torch.isfinite(out.float()).all() and 0.01 < out.float().std() < 10
    # the weights are shared: a second workload gets the very same tensors, not copies
    other = materialize("moe_fp8", wl({"seq_len": 1}, "other"), seed=9)
    for i in range(4, 8):
        assert other[i] is args[i]
    experts, _ = _route(other[0], other[1], 2.5)
    assert (experts < 32).any(), "single-token workload steered to a local expert"


def test_moe_routing_rate_is_realistic():
    """Routing logits alone (weights not needed): about 8 * 32 / 256 = 1 local pick per token."""
    from kdispatch.references.moe_fp8 import _route

    moe = definitions.get("moe_fp8")
    ctx = W.Context(moe.name, "rate", 0, torch.device("cpu"))
    axes = {"seq_len": 4096, "num_experts": 256, "num_local_experts": 32, "hidden_size": 128}
    given = {"local_expert_offset": 0, "routed_scaling_factor": 2.5, "hidden_states": 0, "hidden_states_scale": 0,
             "gemm1_weights": 0, "gemm1_weights_scale": 0, "gemm2_weights": 0, "gemm2_weights_scale": 0}
    out = moe.spec.build(axes, given, ctx)
    experts, _ = _route(out["routing_logits"], out["routing_bias"], 2.5)
    per_token = (experts < 32).sum(1).float()
    assert 0.7 < per_token.mean() < 1.3 and 0.3 < (per_token > 0).float().mean() < 0.7


# ------------------------------------------------------------------------------------------------
# Real contest workloads (cheap invariants; MoE skipped)
# ------------------------------------------------------------------------------------------------

def test_real_indexer_workloads():
    from kdispatch.references import dsa_topk_indexer as ref

    lines = contest_workloads("dsa_topk_indexer")
    widest = max(lines, key=lambda t: t["workload"]["axes"]["batch_size"] * t["workload"]["axes"]["max_num_pages"])
    one_page = next(t for t in lines if t["workload"]["axes"]["max_num_pages"] == 1)
    for i, line in enumerate((widest, one_page)):
        x = check_indexer(line["workload"]["axes"], materialize("dsa_topk_indexer", line))
        if i == 0:
            check_indexer_output(x, ref.run(*x.values()))


def test_real_sparse_attention_workload():
    line = max(contest_workloads("dsa_sparse_attention"), key=lambda t: t["workload"]["axes"]["num_tokens"])
    x = check_sparse(line["workload"]["axes"], materialize("dsa_sparse_attention", line))
    assert ((x["sparse_indices"] >= 0).sum(1) == TOPK).any()


def test_real_gdn_workloads():
    prefill = contest_workloads("gdn_prefill")
    for line in (max(prefill, key=lambda t: t["workload"]["axes"]["num_seqs"]), prefill[0]):
        check_gdn("gdn_prefill", line["workload"]["axes"], materialize("gdn_prefill", line))
    decode = max(contest_workloads("gdn_decode"), key=lambda t: t["workload"]["axes"]["batch_size"])
    check_gdn("gdn_decode", decode["workload"]["axes"], materialize("gdn_decode", decode))
