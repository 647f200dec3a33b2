"""Results store (keys, missing pairs, its FlashInfer-Bench trace twin), the route / explain commands
from a store alone, and candidate landing (`kdispatch add`)."""
import json
import os
import textwrap

import pytest

from kdispatch import registry
from kdispatch.tuner import cli as tcli
from kdispatch.tuner import landing
from kdispatch.tuner.store import STATUSES, Result, Store, read_twin, store_of

DECODE = "gdn_decode_qk4_v8_d128_k_last"
ENV = {"device": "Fake GPU", "arch": "sm90", "driver": "1", "torch": "2", "triton": "3", "cuda": "13", "flashinfer": "0"}


def row(eid, variant, uuid, t, status="PASSED", baseline=False, h="h1"):
    return Result(env=eid, definition=DECODE, variant=variant, variant_hash=h, uuid=uuid,
                  axes={"batch_size": int(uuid[1:])}, status=status, measured_at="2026-01-01T00:00:00Z",
                  baseline=baseline, method="graph", median_us=t if status == "PASSED" else None,
                  p10_us=t * 0.99 if status == "PASSED" else None, p90_us=t * 1.01 if status == "PASSED" else None,
                  max_abs_err=0.001, max_rel_err=0.002, reason="" if status == "PASSED" else "bad")


def filled(path=":memory:"):
    s = Store(path)
    eid = s.add_env(ENV)
    for b in (1, 2, 4, 8, 16, 32):  # three a side of the split: the fitter's min_leaf
        s.put_workload(DECODE, f"w{b}", {"batch_size": b}, {"scale": {"type": "scalar", "value": 0.088}})
        s.put(row(eid, "flashinfer", f"w{b}", 10.0 + b, baseline=True))
        s.put(row(eid, "fast", f"w{b}", (5.0 + b) if b < 8 else 50.0))
    s.put(row(eid, "broken", "w1", 0, status="INCORRECT_NUMERICAL"))
    return s, eid


def test_missing_pairs_follow_hash_env_and_uuid():
    s, eid = filled()
    assert s.missing(eid, DECODE, {"flashinfer": "h1", "fast": "h1"}, ["w1", "w2", "w8", "w16"]) == []
    assert s.missing(eid, DECODE, {"fast": "h2"}, ["w1", "w2"]) == [("fast", "w1"), ("fast", "w2")]
    assert s.missing(eid, DECODE, {"fast": "h1"}, ["w1", "w99"]) == [("fast", "w99")]
    other = s.add_env({**ENV, "driver": "2"})
    assert len(s.missing(other, DECODE, {"fast": "h1"}, ["w1", "w2"])) == 2


def test_text_twin_round_trip_is_byte_stable(tmp_path):
    s, _ = filled(tmp_path / "a.sqlite")
    s.dump_jsonl()
    data = (tmp_path / "traces" / "a.jsonl.gz").read_bytes()
    fresh = tmp_path / "clone"
    (fresh / "traces").mkdir(parents=True)
    (fresh / "traces" / "b.jsonl.gz").write_bytes(data)
    t = Store.open(fresh / "b.sqlite")  # a fresh clone: only the twin exists
    assert {r.key: r for r in t.results()} == {r.key: r for r in s.results()}
    t.dump_jsonl()
    assert (fresh / "traces" / "b.jsonl.gz").read_bytes() == data


def test_a_later_hash_supersedes_the_rows_it_re_measured():
    s, eid = filled()
    later = row(eid, "fast", "w1", 4.0, h="h2")
    later.measured_at = "2026-01-02T00:00:00Z"
    s.put(later)
    other = s.add_env({**ENV, "driver": "2"})
    s.put(row(other, "fast", "w2", 4.0, h="h0"))  # another environment: not superseded by its h1 rows
    assert s.drop_superseded() == 1
    kept = {(r.env, r.variant, r.variant_hash, r.uuid) for r in s.results()}
    assert (eid, "fast", "h1", "w1") not in kept and (eid, "fast", "h2", "w1") in kept
    assert (eid, "fast", "h1", "w2") in kept and (other, "fast", "h0", "w2") in kept
    assert s.drop_superseded() == 0


def test_statuses_are_flashinfer_bench_evaluation_statuses():
    pytest.importorskip("flashinfer_bench")
    from flashinfer_bench.data import EvaluationStatus

    assert set(STATUSES) <= {s.value for s in EvaluationStatus}
    s, eid = filled()
    with pytest.raises(ValueError, match="unknown status"):
        s.put(row(eid, "fast", "w1", 1.0, status="MOSTLY_FINE"))


def test_the_twin_is_a_flashinfer_bench_trace_set(tmp_path):
    pytest.importorskip("flashinfer_bench")
    from flashinfer_bench.data import TraceSet

    s, eid = filled(tmp_path / "fake.sqlite")
    for status in ("RUNTIME_ERROR", "TIMEOUT", "COMPILE_ERROR"):  # no correctness, no performance
        s.put(row(eid, status.lower(), "w2", 0, status=status))
    plain = tmp_path / "plain"  # the twin decompressed
    (plain / "traces").mkdir(parents=True)
    (plain / "traces" / "fake.jsonl").write_text(read_twin(s.dump_jsonl()))
    ts = TraceSet.from_path(str(plain))
    traces = ts.traces[DECODE]
    assert len(traces) == 2 * 6 + 1 + 3  # two rows a workload, the broken one, the three failures
    want = {(r.variant, r.uuid): r.status for r in s.results()}
    assert {(t.solution, t.workload.uuid): t.evaluation.status.value for t in traces} == want
    fast1 = next(t for t in traces if t.solution == "fast" and t.workload.uuid == "w1")
    perf = fast1.evaluation.performance
    assert abs(perf.latency_ms - 0.006) < 1e-9 and abs(perf.reference_latency_ms - 0.011) < 1e-9
    assert abs(perf.speedup_factor - 11 / 6) < 1e-5  # 6 significant digits in the twin
    broken = next(t for t in traces if t.solution == "broken")
    assert broken.evaluation.status.value == "INCORRECT_NUMERICAL" and broken.evaluation.performance is None


def test_the_reference_latency_is_the_newest_baseline_measurement(tmp_path):
    s, eid = filled(tmp_path / "fake.sqlite")
    newer = row(eid, "flashinfer", "w1", 22.0, baseline=True, h="h0")  # a re-measured baseline, older hash name
    newer.measured_at = "2026-02-01T00:00:00Z"
    s.put(newer)
    s.dump_jsonl()
    lines = [json.loads(x) for x in read_twin(tmp_path / "traces" / "fake.jsonl.gz").splitlines()]
    fast1 = next(x for x in lines if x["solution"] == "fast" and x["workload"]["uuid"] == "w1")
    assert abs(fast1["evaluation"]["performance"]["reference_latency_ms"] - 0.022) < 1e-9


def test_a_twin_outside_traces_is_refused(tmp_path):
    for name in ("x.jsonl.gz", "traces/x.jsonl"):  # outside traces/, or not compressed
        with pytest.raises(ValueError, match="traces"):
            Store.open(tmp_path / name)


def test_the_committed_results_load_as_a_trace_set(tmp_path):
    """tuner/results/ itself: FlashInfer-Bench reads every committed row, with the store's statuses."""
    pytest.importorskip("flashinfer_bench")
    import shutil

    from flashinfer_bench.data import TraceSet

    from kdispatch.tuner.store import RESULTS_DIR

    twins = sorted((RESULTS_DIR / "traces").glob("*.jsonl.gz"))
    assert twins, "committed results"
    plain = tmp_path / "plain"  # the twins decompressed: the trace set FlashInfer-Bench reads
    (plain / "traces").mkdir(parents=True)
    for twin in twins:
        (plain / "traces" / twin.name[:-3]).write_text(read_twin(twin))
    ts = TraceSet.from_path(str(plain))
    got = {(t.definition, t.solution, t.workload.uuid, t.evaluation.environment.hardware,
            t.evaluation.timestamp): t.evaluation.status.value for v in ts.traces.values() for t in v}
    (tmp_path / "traces").mkdir()
    want = {}
    for twin in twins:  # opened from a copy: the test never writes into the repository
        shutil.copy(twin, tmp_path / "traces" / twin.name)
        store = Store.open(store_of(tmp_path / "traces" / twin.name))
        envs = {e["id"]: e["device"] for e in store.envs()}
        rows = store.results()
        want.update({(r.definition, r.variant, r.uuid, envs[r.env], r.measured_at): r.status for r in rows})
        assert len(rows) == len(read_twin(twin).splitlines())
    assert got == want and len(got) == sum(len(v) for v in ts.traces.values())


def test_route_and_explain_from_the_store(tmp_path, capsys):
    s, _ = filled(tmp_path / "fake.sqlite")
    s.dump_jsonl()
    out = tmp_path / "routers"
    parser = __import__("argparse").ArgumentParser()
    tcli.add_commands(parser.add_subparsers(dest="command"))
    # the measured variant must be registered: `route` leaves out the rows of one that is not
    registry.register(registry.Variant(DECODE, "fast", lambda *a: None, "triton", ("sm90",)))
    try:
        args = parser.parse_args(["route", "--store", str(tmp_path / "fake.sqlite"), "--out", str(out)])
        assert args.func(args) == 0
        text = (out / "sm90" / f"{DECODE}.py").read_text()
        assert "return 'fast'" in text and "return 'flashinfer'" in text
        args = parser.parse_args(["explain", "gdn_decode", "batch_size=3", "--arch", "sm90", "--routers", str(out),
                                  "--store", str(tmp_path / "fake.sqlite")])
        assert args.func(args) == 0
    finally:
        registry.unregister(DECODE, "fast")
    said = capsys.readouterr().out
    assert "-> fast" in said and "region 1" in said


# ---- landing ---------------------------------------------------------------------------------

CANDIDATE = '''
from kdispatch.registry import variant


@variant("gdn_decode", "{name}", backend="triton", archs=("sm90",))
def run(q, k, v, state, A_log, a, dt_bias, b, scale):
    return q, state
'''


def test_add_lands_a_module_with_provenance(tmp_path):
    src = tmp_path / "my_decode.py"
    src.write_text(CANDIDATE.format(name="agent_decode_v1"))
    kernels = tmp_path / "kernels"
    try:
        prov = landing.add(src, author="agent-7", parent="flashinfer", kernels_dir=kernels, date="2026-01-02")
        landed = kernels / "triton" / "gdn" / "my_decode.py"
        assert landed.read_text() == src.read_text()
        side = json.loads((kernels / "triton" / "gdn" / "my_decode.provenance.json").read_text())
        assert side["author"] == "agent-7" and side["parent"] == "flashinfer" and side["date"] == "2026-01-02"
        assert side["variants"][0]["name"] == "agent_decode_v1" and prov["files"]
        assert (kernels / "triton" / "__init__.py").exists() and (kernels / "triton" / "gdn" / "__init__.py").exists()
        v = registry.get(DECODE, "agent_decode_v1")
        assert v.source == landed.resolve() and landed.resolve() in v.files
    finally:
        registry.unregister(DECODE, "agent_decode_v1")


def test_add_refuses_reference_baseline_and_bad_signatures(tmp_path):
    for name in ("reference", "flashinfer"):
        src = tmp_path / f"bad_{name}.py"
        src.write_text(CANDIDATE.format(name=name))
        with pytest.raises(landing.LandingError):
            landing.add(src, kernels_dir=tmp_path / "kernels")
    src = tmp_path / "short_sig.py"
    src.write_text(textwrap.dedent('''
        from kdispatch.registry import variant

        @variant("gdn_decode", "too_few_args", backend="triton", archs=("sm90",))
        def run(q, k, v):
            return q
    '''))
    with pytest.raises(landing.LandingError, match="does not accept"):
        landing.add(src, kernels_dir=tmp_path / "kernels")
    with pytest.raises(KeyError):
        registry.get(DECODE, "too_few_args")  # nothing stays registered after a refusal
    assert not (tmp_path / "kernels" / "triton" / "gdn" / "short_sig.py").exists()


def test_add_lands_a_flashinfer_bench_solution(tmp_path):
    pytest.importorskip("flashinfer_bench")
    sol = {"name": "agent-gdn-decode-py", "definition": DECODE, "author": "agent-9",
           "spec": {"language": "python", "target_hardware": ["cuda"], "entry_point": "main.py::run",
                    "destination_passing_style": False},
           "sources": [{"path": "main.py", "content": "def run(q, k, v, state, A_log, a, dt_bias, b, scale):\n"
                                                      "    return q, state\n"}]}
    src = tmp_path / "solution.json"
    src.write_text(json.dumps(sol))
    kernels = tmp_path / "kernels"
    try:
        prov = landing.add(src, kernels_dir=kernels, date="2026-01-03")
        name = "agent_gdn_decode_py"
        wrapper = kernels / "torch" / "gdn" / f"fib_{name}.py"
        assert wrapper.exists() and (kernels / "torch" / "gdn" / f"fib_{name}.solution.json").exists()
        assert prov["author"] == "agent-9"
        v = registry.get(DECODE, name)
        assert v.requires == ("flashinfer_bench",) and v.meta["solution"] == "agent-gdn-decode-py"
        bad = dict(sol, name="reference")
        src.write_text(json.dumps(bad))
        with pytest.raises(landing.LandingError):
            landing.add(src, kernels_dir=kernels)
    finally:
        registry.unregister(DECODE, "agent_gdn_decode_py")


def test_bench_counts_slower_only_where_the_routed_op_served_another_variant():
    """A routed op that served the baseline itself is the baseline's call (plus dispatch, measured on
    its own): its drift against the baseline's measurement is not "slower"; a variant is. A gap there
    beyond the margin is counted apart, to look into ("behind_baseline")."""
    from kdispatch.tuner.flows import bench_table

    s, eid = filled()
    for b, served, t in ((1, "flashinfer", 20.0), (2, "fast", 20.0), (8, "flashinfer", 18.0)):
        r = row(eid, "routed", f"w{b}", t)
        r.metrics = {"routed_to": served, "routed_to_eager": served}
        s.put(r)
    _, summary = bench_table(s, eid, DECODE)
    assert summary["graph"]["slower_than_baseline"] == 1  # w2 only (w1: 20 vs 11, but the baseline's call)
    assert summary["graph"]["behind_baseline"] == 1  # w1 (w8 at 18 is within the baseline's margin)
    assert summary["graph"]["regret_max_pct"] > 0


def test_bench_compares_a_handed_back_region_with_the_guarded_call():
    """Where the routed op's region hands calls back (engine plugins call the engine's kernel), the
    routed op serves kdispatch.ops callers, whose alternative is the guarded baseline: it is slower
    only against that. The same time outside such a region is slower than the engine's call."""
    from kdispatch.tuner.flows import bench_table

    s, eid = filled()
    base = next(r for r in s.results(DECODE, eid) if r.baseline and r.uuid == "w4")  # 14 us, guarded 20
    base.metrics = {"guarded": {"median_us": 20.0, "p10_us": 19.8, "p90_us": 20.2, "eager_us": None,
                                "eager_p10_us": None, "eager_p90_us": None}}
    s.put(base)
    for back in (True, False):
        r = row(eid, "routed", "w4", 17.0)
        r.metrics = {"routed_to": "fast", "routed_to_eager": "fast", "hands_back": back}
        s.put(r)
        _, summary = bench_table(s, eid, DECODE)
        assert summary["graph"]["slower_than_baseline"] == (0 if back else 1)
        assert summary["graph"]["handed_back"] == (1 if back else 0)
        assert summary["graph"]["routed_geomean_speedup"] == round(20 / 17 if back else 14 / 17, 3)


def test_bench_compares_the_routed_op_with_each_library_peer():
    """Every library-backed variant besides the baseline is a peer: per mode, peer / routed over the
    workloads both timed (graph: a peer that cannot be captured is left out) and the workloads where
    the routed op is slower than it beyond the noise margin. No peer measured: no entry."""
    from kdispatch.tuner.flows import bench_table

    s, eid = filled()
    for b in (1, 2, 4, 8, 16, 32):
        r = row(eid, "routed", f"w{b}", 10.0)
        r.metrics = {"routed_to": "fast", "routed_to_eager": "fast"}
        s.put(r)
    assert "peers" not in bench_table(s, eid, DECODE)[1]
    for b in (1, 2, 4, 8):
        peer = row(eid, "lib", f"w{b}", 20.0 if b != 8 else 5.0)
        peer.backend = "library"
        peer.eager_us, peer.eager_p10_us, peer.eager_p90_us = 30.0, 29.0, 31.0
        s.put(peer)
    captured_only = row(eid, "lib_eager", "w1", 5.0)
    captured_only.backend, captured_only.method = "library", "events:capture-failed"
    s.put(captured_only)
    peers = bench_table(s, eid, DECODE)[1]["peers"]
    graph = peers["lib"]["graph"]
    assert graph["workloads"] == 4 and graph["slower_than_peer"] == 1
    assert graph["routed_min_speedup"] == 0.5 and graph["routed_geomean_speedup"] == round((2 * 2 * 2 * 0.5) ** 0.25, 3)
    assert peers["lib"]["eager"]["workloads"] == 0  # the routed rows have no eager time
    assert peers["lib_eager"]["graph"]["workloads"] == 0


def test_bench_routes_a_workload_that_omits_dependent_axes(tmp_path):
    """Coverage and held-out prefill workloads give num_seqs and total_seq_len, not len_cu_seqlens
    (the definition's constraint implies it); the routed op is asked with every axis a call has."""
    import kdispatch.ops
    from kdispatch.tuner import flows

    d = kdispatch.ops.DISPATCHERS["gdn_prefill"]
    name = d.definition
    folder = tmp_path / "set" / "workloads" / "gdn"
    folder.mkdir(parents=True)
    w = {"definition": name, "workload": {"uuid": "short-prefill", "axes": {"total_seq_len": 6, "num_seqs": 2},
                                          "inputs": {}}, "solution": None, "evaluation": None}
    (folder / f"{name}.jsonl").write_text(json.dumps(w) + "\n")
    seen = []
    d.set_router("cpu", lambda total_seq_len, num_seqs, len_cu_seqlens: seen.append(len_cu_seqlens) or "reference")
    try:
        store, info = flows.bench([tmp_path / "set"], definitions=["gdn_prefill"], variants=["reference"],
                                  device="cpu", quick=True, in_process=True, stream=open(os.devnull, "w"))
    finally:
        d.unset_router("cpu")
    routed = [r for r in store.results(name) if r.variant == "routed"]
    assert [r.status for r in routed] == ["PASSED"] and 3 in seen


def test_bench_calls_the_op_with_each_workloads_hints_too(tmp_path, monkeypatch):
    """For a definition with call-time hints the bench measures the routed op twice: as called without
    them ("routed") and with the workload's values ("routed_hinted", routed by `route_hinted`), each
    with its own summary rows."""
    import kdispatch.ops
    from kdispatch.tuner import flows
    from kdispatch.workloads import hint_values

    d = kdispatch.ops.DISPATCHERS["gdn_prefill_pool_qk4_v8"]
    name = d.definition
    folder = tmp_path / "set" / "workloads" / "gdn"
    folder.mkdir(parents=True)
    w = {"definition": name, "workload": {"uuid": "hinted-prefill", "inputs": {},
                                          "axes": {"total_seq_len": 9, "num_seqs": 3, "num_slots": 4}},
         "solution": None, "evaluation": None}
    (folder / f"{name}.jsonl").write_text(json.dumps(w) + "\n")
    jobs, make_jobs = [], flows.make_jobs
    monkeypatch.setattr(flows, "make_jobs", lambda *a, **k: jobs.extend(make_jobs(*a, **k)) or jobs)
    seen = []
    d.set_router("cpu", lambda **axes: "reference",
                 route_hinted=lambda max_seq_len, **axes: seen.append(max_seq_len) or "reference")
    try:
        store, info = flows.bench([tmp_path / "set"], definitions=[name], variants=["reference"],
                                  device="cpu", quick=True, in_process=True, stream=open(os.devnull, "w"))
    finally:
        d.unset_router("cpu")
    status = {r.variant: r.status for r in store.results(name)}
    assert status.get("routed") == "PASSED" and status.get("routed_hinted") == "PASSED"
    assert jobs and all(j.extra.get("eager_turns") for j in jobs)  # measured together: eager times in turns
    assert seen and set(seen) == {hint_values(name, w)["max_seq_len"]}
    _, summary = flows.bench_table(store, store.envs()[0]["id"], name)
    assert summary["graph"]["routed_geomean_speedup"] and summary["hinted"]["graph"]["routed_geomean_speedup"]
    assert set(summary["hinted"]) == {"graph", "eager"}


def test_bench_stops_at_max_minutes_and_says_so(tmp_path):
    """A time-limited bench keeps what it measured and reports the pairs left (the GPU machine's
    commands run at most 10 minutes; a bench killed by its timeout wrote nothing)."""
    from kdispatch.tuner import flows

    name = "gdn_decode_qk4_v8_d128_k_last"
    folder = tmp_path / "set" / "workloads" / "gdn"
    folder.mkdir(parents=True)
    ws = [{"definition": name, "workload": {"uuid": f"decode-{b}", "axes": {"batch_size": b}, "inputs": {}},
           "solution": None, "evaluation": None} for b in (1, 2)]
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(w) + "\n" for w in ws))
    kw = dict(definitions=[name], variants=["reference"], device="cpu", quick=True, in_process=True,
              stream=open(os.devnull, "w"))
    store, info = flows.bench([tmp_path / "set"], max_minutes=-1, **kw)  # past its deadline at once
    assert info["complete"] is False and info["pending"] > 0 and not store.results(name)
    store, info = flows.bench([tmp_path / "set"], **kw)
    assert info["complete"] is True and info["pending"] == 0 and store.results(name)
