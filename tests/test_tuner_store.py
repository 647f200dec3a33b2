"""Results store (keys, missing pairs, text twin), FlashInfer-Bench trace export, the route /
explain commands from a store alone, and candidate landing (`kdispatch add`)."""
import json
import textwrap

import pytest

from kdispatch import registry
from kdispatch.tuner import cli as tcli
from kdispatch.tuner import landing
from kdispatch.tuner.store import Result, Store

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
    for b in (1, 2, 8, 16):
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
    text = (tmp_path / "a.jsonl").read_text()
    (tmp_path / "b.jsonl").write_text(text)
    t = Store.open(tmp_path / "b.sqlite")  # a fresh clone: only the .jsonl exists
    assert len(t.results()) == len(s.results())
    t.dump_jsonl()
    assert (tmp_path / "b.jsonl").read_text() == text
    assert all(json.loads(line)["kind"] in ("env", "workload", "result") for line in text.splitlines())


def test_export_traces_is_valid_flashinfer_bench(tmp_path):
    pytest.importorskip("flashinfer_bench")
    from flashinfer_bench.data import Trace, TraceSet

    s, _ = filled()
    paths = s.export_traces(tmp_path)
    lines = paths[0].read_text().splitlines()
    traces = [Trace.model_validate_json(line) for line in lines]
    assert len(traces) == 9
    fast1 = next(t for t in traces if t.solution == "fast" and t.workload.uuid == "w1")
    assert fast1.evaluation.status.value == "PASSED"
    perf = fast1.evaluation.performance
    assert abs(perf.latency_ms - 0.006) < 1e-9 and abs(perf.reference_latency_ms - 0.011) < 1e-9
    assert abs(perf.speedup_factor - 11 / 6) < 1e-6
    broken = next(t for t in traces if t.solution == "broken")
    assert broken.evaluation.status.value == "INCORRECT_NUMERICAL" and broken.evaluation.performance is None
    ts = TraceSet.from_path(str(tmp_path))
    assert len(ts.traces[DECODE]) == 9


def test_route_and_explain_from_the_store(tmp_path, capsys):
    s, _ = filled(tmp_path / "fake.sqlite")
    s.dump_jsonl()
    out = tmp_path / "routers"
    parser = __import__("argparse").ArgumentParser()
    tcli.add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["route", "--store", str(tmp_path / "fake.sqlite"), "--out", str(out)])
    assert args.func(args) == 0
    text = (out / "sm90" / f"{DECODE}.py").read_text()
    assert "return 'fast'" in text and "return 'flashinfer'" in text
    args = parser.parse_args(["explain", "gdn_decode", "batch_size=3", "--arch", "sm90", "--routers", str(out),
                              "--store", str(tmp_path / "fake.sqlite")])
    assert args.func(args) == 0
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
        assert v.sources[0] == landed.resolve()
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
