"""Adding a definition takes its JSON, a reference, a spec and variants, and nothing else: a toy
operator defined entirely in this test's temporary folder is materialised, gated, timed, fitted
and compiled into a router on the CPU by the real tuner."""
import contextlib
import importlib
import importlib.metadata
import io
import json
import os
import sys
import textwrap

import pytest
import torch

from kdispatch import definitions, registry
from kdispatch.spec import Spec
from kdispatch.tuner import flows
from kdispatch.tuner.store import Store

NAME = "toy_scale_h4"
ENV = {"device": "CPU", "arch": "cpu", "driver": "none", "torch": "2", "triton": "3", "cuda": "none",
       "flashinfer": "none"}

DEFINITION = {
    "name": NAME, "op_type": "toy", "description": "y = alpha * x, row by row.",
    "axes": {"num_rows": {"type": "var"}, "width": {"type": "const", "value": 4}},
    "inputs": {"x": {"shape": ["num_rows", "width"], "dtype": "float32"},
               "alpha": {"shape": None, "dtype": "float32"}},
    "outputs": {"y": {"shape": ["num_rows", "width"], "dtype": "float32"}},
    "constraints": [],
}

REFERENCE = '''
import time

import torch


def run(x, alpha):
    time.sleep(0.002)  # a slow oracle, so that the variant clearly wins
    return (x.double() * alpha).float()
'''

VARIANT = '''
from kdispatch.registry import variant


@variant("toy_scale", "toy_fast", backend="torch", archs=("*",))
def toy_fast(x, alpha):
    return x * alpha
'''


@contextlib.contextmanager
def extra_variants(*names):
    """Variants registered for the block (the toy's product, under other names): ones that land after a tune."""
    for name in names:
        registry.variant(NAME, name, backend="torch", archs=("*",))(lambda x, alpha: x * alpha)
    try:
        yield
    finally:
        for name in names:
            registry.unregister(NAME, name)


def write_traces(tmp_path, sizes):
    """A trace set under tmp_path/traces with one toy workload "toy-<n>" of n rows per size."""
    folder = tmp_path / "traces" / "workloads" / "toy"
    folder.mkdir(parents=True)
    lines = [{"definition": NAME, "workload": {"uuid": f"toy-{n}", "axes": {"num_rows": n}, "inputs": {}},
              "solution": None, "evaluation": None} for n in sizes]
    (folder / f"{NAME}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def build(axes, given, ctx):
    return {"x": torch.randn(axes["num_rows"], axes["width"], generator=ctx.rng("x"))}


@pytest.fixture
def toy(tmp_path, monkeypatch):
    pkg = tmp_path / "src"
    pkg.mkdir()
    (pkg / "toy_reference.py").write_text(textwrap.dedent(REFERENCE))
    (pkg / "toy_variants.py").write_text(textwrap.dedent(VARIANT))
    monkeypatch.syspath_prepend(str(pkg))
    (tmp_path / f"{NAME}.json").write_text(json.dumps({**DEFINITION, "reference": REFERENCE}))
    spec = Spec(short="toy_scale", family="toy", build=build, fit=("num_rows",), main="num_rows",
                reference="toy_reference", model_scalars={"alpha": 2.0})
    d = definitions.add(tmp_path / f"{NAME}.json", spec)
    importlib.import_module("toy_variants")
    yield d
    registry.unregister(NAME, "toy_fast")
    registry.forget_definition(NAME)
    definitions.remove(NAME)
    for mod in ("toy_variants", "toy_reference"):
        sys.modules.pop(mod, None)


def test_a_toy_definition_tunes_end_to_end_on_cpu(tmp_path, toy):
    write_traces(tmp_path, (1, 3, 8, 32))

    assert [v.name for v in registry.variants("toy_scale")] == ["reference", "toy_fast"]
    r = flows.tune(tmp_path / "traces", definitions=["toy_scale"], device="cpu", env=ENV,
                   store=tmp_path / "store" / "cpu.sqlite", out=tmp_path / "routers", quick=True,
                   stream=open(os.devnull, "w"))
    assert r.complete
    rows = Store.open(tmp_path / "store" / "cpu.sqlite").results(NAME)
    assert {(x.variant, x.status) for x in rows} == {("reference", "PASSED"), ("toy_fast", "PASSED")}
    assert len(rows) == 8, "both variants on all four workloads"
    assert not any("eager_turns_s" in x.metrics for x in rows), "a tune keeps each variant's own eager loop"
    router = (tmp_path / "routers" / "cpu" / f"{NAME}.py").read_text()
    assert "def route(num_rows):" in router
    assert "return 'toy_fast'" in router


def test_a_wrong_toy_variant_fails_the_gate(tmp_path, toy):
    from kdispatch.tuner import gate
    from kdispatch.workloads import materialize

    w = {"uuid": "toy-gate", "axes": {"num_rows": 5}, "inputs": {}}
    args = list(materialize("toy_scale", w))
    trials = [(args, gate.reference("toy_scale", args))]
    assert gate.run_gate("toy_scale", registry.get(NAME, "toy_fast").fn, trials).passed
    assert not gate.run_gate("toy_scale", lambda x, alpha: x * (alpha + 0.1), trials).passed


def test_launch_configurations_are_variants_of_their_own(toy):
    def scaled(x, alpha, *, extra):
        return x * alpha + extra

    registry.variant("toy_scale", "toy_cfg", backend="torch", archs=("*",),
                     configs={"e0": dict(extra=0.0), "e1": dict(extra=1.0)},
                     supports=lambda f, c: None if c["extra"] == 0.0 or f["num_rows"] <= 4 else "too many rows")(scaled)
    try:
        e0, e1 = registry.get(NAME, "toy_cfg.e0"), registry.get(NAME, "toy_cfg.e1")
        x = torch.ones(2, 4)
        assert torch.equal(e0.fn(x, 2.0), x * 2) and torch.equal(e1.fn(x, 2.0), x * 2 + 1)
        assert e1.config == {"extra": 1.0} and e0.provenance != e1.provenance
        assert e1.declines({"num_rows": 5}) == "too many rows" and e0.declines({"num_rows": 5}) is None
        assert "toy_cfg" not in [v.name for v in registry.variants("toy_scale")]
        from kdispatch.tuner import codegen

        assert codegen._configs(NAME, ["toy_fast", "toy_cfg.e1", "gone"]) == {"toy_cfg.e1": "extra=1.0"}  # the header
    finally:
        registry.unregister(NAME, "toy_cfg.e0")
        registry.unregister(NAME, "toy_cfg.e1")


def test_a_check_on_measurements_older_than_the_code_names_them(tmp_path, toy, monkeypatch):
    """`kdispatch route --check` scores routers on a store measured by other code than the variants'
    now: it warns and its summary names those variants (README's held-out table then says so)."""
    import io

    write_traces(tmp_path, (2, 5))
    store = tmp_path / "store" / "cpu.sqlite"
    flows.tune(tmp_path / "traces", definitions=["toy_scale"], device="cpu", env=ENV, store=store,
               out=tmp_path / "routers", quick=True, stream=open(os.devnull, "w"))
    check = Store.open(store)
    done = flows.compile_all(check, tmp_path / "routers", "cpu", ["toy_scale"], stream=io.StringIO())
    assert "stale_variants" not in flows.check_routers(done, check, io.StringIO())[NAME]
    monkeypatch.setitem(registry.get(NAME, "toy_fast").__dict__, "provenance", "0" * 16)  # its code changed
    said = io.StringIO()
    summary = flows.check_routers(done, check, said)[NAME]
    assert summary["stale_variants"] == ["toy_fast"]
    assert "[check] warning: toy_scale toy_fast: provenance changed" in said.getvalue()


def test_a_library_variants_rows_let_another_machine_find_its_code_changed(tmp_path, toy):
    """A library-backed variant's hash includes the library versions where it ran; its rows record
    them, so a check here (where those libraries may differ) still finds a change of its code."""
    import io

    (tmp_path / "src" / "toy_library.py").write_text(textwrap.dedent('''
        from kdispatch.registry import variant


        @variant("toy_scale", "toy_library", backend="library", archs=("*",), requires=("torch",))
        def toy_library(x, alpha):
            return x * alpha
    '''))
    importlib.import_module("toy_library")
    try:
        write_traces(tmp_path, (3,))
        store = tmp_path / "store" / "cpu.sqlite"
        flows.tune(tmp_path / "traces", definitions=["toy_scale"], device="cpu", env=ENV, store=store,
                   out=tmp_path / "routers", quick=True, stream=open(os.devnull, "w"))
        row = next(r for r in Store.open(store).results(NAME) if r.variant == "toy_library")
        # the distribution's version ("2.14.1" where torch.__version__ says "2.14.1+cu130")
        assert row.metrics["library_versions"] == {"torch": importlib.metadata.version("torch")}
        check = Store.open(store)
        done = flows.compile_all(check, tmp_path / "routers", "cpu", ["toy_scale"], stream=io.StringIO())
        assert "stale_variants" not in flows.check_routers(done, check, io.StringIO())[NAME]
        source = tmp_path / "src" / "toy_library.py"
        source.write_text(source.read_text() + "# changed\n")  # its code, measured under other libraries
        assert flows.check_routers(done, check, io.StringIO())[NAME]["stale_variants"] == ["toy_library"]
    finally:
        registry.unregister(NAME, "toy_library")
        sys.modules.pop("toy_library", None)


def test_tune_fits_the_routers_with_the_workloads_call_time_hints(tmp_path, toy, monkeypatch):
    """`kdispatch tune` compiles the routers as `kdispatch route` does: a definition with call-time
    hints gets its hinted fit from the tuned workloads' hint values (without them a re-tune would
    drop `route_hinted` from the routers)."""
    import dataclasses

    from kdispatch.spec import Hint

    hint = Hint("twice the rows (a toy fact)", lambda axes, given, ctx: 2 * axes["num_rows"])
    monkeypatch.setitem(toy.__dict__, "spec", dataclasses.replace(toy.spec, hints={"double": hint}))
    asked = []
    compile_all = flows.compile_all
    monkeypatch.setattr(flows, "compile_all", lambda *a, **kw: asked.append(kw.get("hints")) or compile_all(*a, **kw))
    tuned(tmp_path, (1, 3, 8))
    assert asked == [{NAME: {f"toy-{n}": {"double": 2 * n} for n in (1, 3, 8)}}]


def tuned(tmp_path, sizes) -> Store:
    """The toy definition tuned on the CPU over workloads of these row counts: its store."""
    write_traces(tmp_path, sizes)
    store = tmp_path / "store" / "cpu.sqlite"
    flows.tune(tmp_path / "traces", definitions=["toy_scale"], device="cpu", env=ENV, store=store,
               out=tmp_path / "routers", quick=True, stream=open(os.devnull, "w"))
    return Store.open(store)


def test_a_variant_no_longer_registered_is_left_out_of_the_fit(tmp_path, toy):
    """The store keeps a retired variant's rows (one split into launch configurations, say); a router
    naming it could not serve it, so `route` leaves them out and says so."""
    import io

    measured = tuned(tmp_path, (1, 3, 8, 32))
    flows.compile_all(measured, tmp_path / "kept", "cpu", ["toy_scale"], stream=io.StringIO())
    assert "return 'toy_fast'" in (tmp_path / "kept" / "cpu" / f"{NAME}.py").read_text()
    registry.unregister(NAME, "toy_fast")
    said = io.StringIO()
    flows.compile_all(measured, tmp_path / "retired", "cpu", ["toy_scale"], stream=said)
    assert "toy_fast" not in (tmp_path / "retired" / "cpu" / f"{NAME}.py").read_text()
    assert "[route] warning: toy_scale toy_fast: no longer registered" in said.getvalue()


def test_workloads_a_measured_variant_lacks_are_left_out_of_the_fit(tmp_path, toy):
    """A tune cut short leaves a variant unmeasured on some workloads; fitted on, only the baseline
    (here the reference) would be admissible there. `route` leaves those workloads out and says so."""
    import io

    measured = tuned(tmp_path, (1, 3, 8, 32))
    measured.db.execute("DELETE FROM result WHERE variant = 'toy_fast' AND uuid IN ('toy-8', 'toy-32')")
    said = io.StringIO()
    flows.compile_all(measured, tmp_path / "cut", "cpu", ["toy_scale"], stream=said)
    assert "return 'toy_fast'" in (tmp_path / "cut" / "cpu" / f"{NAME}.py").read_text()
    assert "[route] warning: toy_scale: 2 workload(s) left out" in said.getvalue()


def test_screening_leaves_a_far_slower_variant_ungated_and_untimed(tmp_path, toy):
    """`tune(screen=2)`: a variant whose rough time is over twice the fastest's in both call modes
    gets a TIMEOUT row with its rough times and no gate; the fitter never routes to it, and a router
    that did is charged its rough time (not counted as routing to a failure)."""
    import time as _time

    from kdispatch.tuner import fit as fitting
    from kdispatch.tuner.store import twin_of

    def toy_slow(x, alpha):
        _time.sleep(0.03)  # 15x the reference's 2 ms
        return x * alpha

    registry.variant("toy_scale", "toy_slow", backend="torch", archs=("*",))(toy_slow)
    try:
        write_traces(tmp_path, (2, 9))
        path = tmp_path / "store" / "cpu.sqlite"
        log = io.StringIO()
        r = flows.tune(tmp_path / "traces", definitions=["toy_scale"], device="cpu", env=ENV, store=path,
                       out=tmp_path / "routers", quick=True, stream=log, screen=2.0)
        assert r.complete
        assert "failed 0, screened out 2" in log.getvalue()  # the progress line: screened is not failed
        rows = {(x.variant, x.uuid): x for x in Store.open(path).results(NAME)}
        assert {v for v, _ in rows} == {"reference", "toy_fast", "toy_slow"}
        for n in (2, 9):
            slow, fast = rows[("toy_slow", f"toy-{n}")], rows[("toy_fast", f"toy-{n}")]
            assert slow.status == "TIMEOUT" and slow.reason.startswith("screened out")
            assert slow.screened["eager_us"] > 2 * slow.screened["best_eager_us"] > 0
            assert "gate_s" not in slow.metrics and slow.median_us is None and not slow.passed
            assert fast.passed and fast.screened is None and "screen_s" in fast.metrics
            for row in (slow, fast):  # what the screen cost, per variant: its first call and its rough times
                assert row.metrics["screen_first_s"] >= 0 and row.metrics["screen_rough_s"] >= 0
            assert slow.metrics["screen_rough_s"] > 0.03  # its rough times: 30 ms calls
        twin = {(x.variant, x.uuid): x for x in Store.open(twin_of(path)).results(NAME)}
        assert twin[("toy_slow", "toy-2")].screened == rows[("toy_slow", "toy-2")].screened
        assert "toy_slow" not in (tmp_path / "routers" / "cpu" / f"{NAME}.py").read_text().split("# fit")[1]

        t = fitting.load_table(Store.open(path), NAME, "cpu")
        assert fitting.variant_summary(t)["toy_slow"] == {**fitting.variant_summary(t)["toy_slow"],
                                                          "screened": 2, "failed": 0, "passed": 0}
        everything_slow = fitting.Policy(NAME, "cpu", "reference",
                                         [fitting.Region({"num_rows": (None, None)}, "toy_slow", t.uuids)])
        s = fitting.measured_regret(everything_slow, t, "eager")
        assert s["unsafe"] == 0 and s["slower_than_baseline"] == 2 and s["regret_mean_pct"] > 100
        assert fitting.measured_regret(everything_slow, t, "graph")["unsafe"] == 0  # the CPU "graph" time is its eager
    finally:
        registry.unregister(NAME, "toy_slow")


def test_the_screen_compares_both_call_modes_and_spares_the_baseline(monkeypatch):
    from kdispatch.tuner import job

    rough = {"base": (10.0, 10.0), "fast": (5.0, 5.0), "slow": (11.0, 30.0), "graph_ok": (9.0, 30.0),
             "eager_ok": (30.0, 9.0), "uncapturable": (None, 30.0)}

    class Variant:
        def __init__(self, name):
            self.name = name

        def __call__(self, *args):
            if rough.get(self.name, "raises") == "raises":
                raise RuntimeError("cannot run this shape")

    monkeypatch.setattr(job, "screen_us", lambda fn, args, graph: rough[fn.name])
    monkeypatch.setattr(job, "resolve_fn", lambda d, name, w=None: Variant(name))
    monkeypatch.setattr(job, "timed_fn", lambda d, name, fn: fn)
    monkeypatch.setattr(job.gate, "private_copy", lambda d, args: args)
    calls = []
    out = job.screen("gdn_decode", "base", ["base", *rough, "raises", "routed"], [torch.zeros(1)], 2.0, calls.append)
    assert set(out) == {"slow", "uncapturable"}
    assert out["slow"] == {"graph_us": 11.0, "eager_us": 30.0, "best_graph_us": 5.0, "best_eager_us": 5.0,
                           "factor": 2.0}
    assert out["uncapturable"]["graph_us"] is None
    assert calls[0] == "base" and "routed" not in calls and "raises" in calls  # each blamed if it crashes

    rough["base"] = "raises"  # no yardstick: nothing is left out
    assert job.screen("gdn_decode", "base", list(rough), [torch.zeros(1)], 2.0) == {}


def test_the_warm_up_calls_each_pending_variant_once_and_stores_nothing(tmp_path, toy):
    """tuner/job.py `warm_job`: one call per (variant, workload) on that workload's inputs, the
    reference and the bench's routed op left out; a variant that raises gets a RUNTIME_ERROR row (for
    the progress line only) and the rest still run."""
    from kdispatch.tuner import job

    calls = []

    def toy_counted(x, alpha):
        calls.append(tuple(x.shape))
        return x * alpha

    def toy_raising(x, alpha):
        raise RuntimeError("this shape is refused")

    registry.variant("toy_scale", "toy_counted", backend="torch", archs=("*",))(toy_counted)
    registry.variant("toy_scale", "toy_raising", backend="torch", archs=("*",))(toy_raising)
    try:
        workloads = [{"uuid": f"toy-{n}", "axes": {"num_rows": n}, "inputs": {}} for n in (3, 7)]
        names = ["reference", "toy_counted", "toy_raising", "routed"]
        emitted = []
        job.warm_job(job.Job(NAME, workloads, {w["uuid"]: names for w in workloads}, device="cpu"),
                     lambda kind, *payload: emitted.append((kind, payload)))
        assert calls == [(3, 4), (7, 4)]
        rows = [p[0] for k, p in emitted if k == "result"]
        assert {(r["variant"], r["uuid"], r["status"]) for r in rows} == {
            ("toy_counted", "toy-3", "PASSED"), ("toy_counted", "toy-7", "PASSED"),
            ("toy_raising", "toy-3", "RUNTIME_ERROR"), ("toy_raising", "toy-7", "RUNTIME_ERROR")}
        assert "refused" in next(r["reason"] for r in rows if r["variant"] == "toy_raising")
        # each call is announced first, so that a crash is blamed on its variant
        starts = [p for k, p in emitted if k == "start"]
        assert starts.index(("toy_raising", "toy-3")) < starts.index(("toy_counted", "toy-7"))
    finally:
        registry.unregister(NAME, "toy_counted")
        registry.unregister(NAME, "toy_raising")


def test_tune_warms_up_on_several_workers_a_gpu_before_measuring(tmp_path, toy, monkeypatch):
    """`tune(warm=N)` on GPUs: first the warm-up jobs on N workers per GPU, then the measuring jobs on one
    worker per GPU; a deadline reached while warming leaves the measuring to the next run; no warm-up on
    the CPU."""
    write_traces(tmp_path, (1, 3, 8, 32))
    runs = []

    def fake_execute(jobs, devices, on_row, progress=None, in_process=None, timeout=300.0, deadline=None):
        runs.append(({j.executor for j in jobs}, list(devices), sum(j.items() for j in jobs)))
        return not (warming_stops and len(runs) == 1)

    monkeypatch.setattr(flows, "execute", fake_execute)
    monkeypatch.setattr(flows, "parse_devices", lambda device: ["cuda:0", "cuda:1"] if device == "cuda" else ["cpu"])
    warming_stops = False
    kw = dict(definitions=["toy_scale"], env=ENV, store=tmp_path / "s.sqlite", compile_routers=False,
              stream=io.StringIO())
    r = flows.tune(tmp_path / "traces", device="cuda", warm=3, **kw)
    warm_run, measure_run = runs
    assert warm_run == ({"kdispatch.tuner.job:warm_job"}, ["cuda:0"] * 3 + ["cuda:1"] * 3, 4)  # toy_fast x 4
    assert measure_run == ({"kdispatch.tuner.job:run_job"}, ["cuda:0", "cuda:1"], 8)  # and the reference
    assert r.complete

    runs.clear()
    warming_stops = True
    assert not flows.tune(tmp_path / "traces", device="cuda", warm=3, **kw).complete
    assert len(runs) == 1

    runs.clear()
    flows.tune(tmp_path / "traces", device="cuda", warm=0, **kw)
    flows.tune(tmp_path / "traces", device="cpu", warm=3, **kw)
    assert [executors for executors, _, _ in runs] == [{"kdispatch.tuner.job:run_job"}] * 2


def test_route_warns_where_a_definition_mixes_the_two_eager_protocols(tmp_path, toy):
    """`tune --eager-turns` takes a workload's eager times in turns; rows of the default (each
    variant's own loop) are not comparable with them, and `route` (or a tune that only measures) says so
    for a mixed definition."""
    import io

    write_traces(tmp_path, (2, 5))
    store = tmp_path / "store" / "cpu.sqlite"
    kw = dict(definitions=["toy_scale"], device="cpu", env=ENV, store=store, out=tmp_path / "routers", quick=True,
              stream=open(os.devnull, "w"))
    flows.tune(tmp_path / "traces", eager_turns=True, **kw)
    rows = Store.open(store).results(NAME)
    assert rows and all("eager_turns_s" in r.metrics for r in rows)
    # a row at or over SLOW_US keeps its own loop's eager time in a turns tune too: not a mix
    import dataclasses

    from kdispatch.tuner.timing import SLOW_US
    slow = Store.open(store)
    slow.put(dataclasses.replace(rows[0], uuid=rows[0].uuid + "-slow", eager_us=SLOW_US + 1.0,
                                 metrics={k: v for k, v in rows[0].metrics.items() if k != "eager_turns_s"}))
    said = io.StringIO()
    done = flows.compile_all(Store.open(store), tmp_path / "routers", "cpu", ["toy_scale"], stream=said)
    assert "eager times in turns" not in said.getvalue()
    # a check says how the eager times it scored were taken (the README's held-out table names the ops)
    assert flows.check_routers(done, Store.open(store), io.StringIO())[NAME]["eager_protocol"] == "turns"
    with extra_variants("toy_twin"):
        told = io.StringIO()  # the new variant in turns on a store of own loops; measured only (as a held-out store is)
        for r in Store.open(store).results(NAME):  # the store's rows as own-loop ones, the slow one aside
            if r.eager_us < SLOW_US:
                slow.put(dataclasses.replace(r, metrics={k: v for k, v in r.metrics.items() if k != "eager_turns_s"}))
        flows.tune(tmp_path / "traces", **{**kw, "stream": told}, eager_turns=True, compile_routers=False)
        assert "[tune] warning: toy_scale on CPU: 2 rows took their eager times in turns and 4" in told.getvalue()
        assert "--eager-turns-only --definitions toy_scale" in told.getvalue()
        done = flows.compile_all(Store.open(store), tmp_path / "routers", "cpu", ["toy_scale"], stream=said)
        assert flows.check_routers(done, Store.open(store), io.StringIO())[NAME]["eager_protocol"] == "mixed"
    assert "toy_scale on CPU: 2 rows took their eager times in turns and 4 in each variant's own loop" in said.getvalue()


def test_a_tune_takes_new_eager_times_as_the_stored_rows_took_them(tmp_path, toy):
    """A variant that lands after a tune in turns takes its eager times in turns too, paired with the
    baseline's calls, without `--eager-turns`: the definition stays of one protocol; in a store of own
    loops it keeps its own loop."""
    import io

    write_traces(tmp_path, (2, 5))
    for turns, where in ((True, "turns"), (False, "own")):
        store = tmp_path / where / "cpu.sqlite"
        kw = dict(definitions=["toy_scale"], device="cpu", env=ENV, store=store, quick=True, compile_routers=False)
        flows.tune(tmp_path / "traces", eager_turns=turns, stream=open(os.devnull, "w"), **kw)
        assert flows.stored_in_turns(Store.open(store), ENV["device"], NAME) is turns
        with extra_variants("toy_twin"):
            told = io.StringIO()
            flows.tune(tmp_path / "traces", stream=told, **kw)
        twin = [r for r in Store.open(store).results(NAME) if r.variant == "toy_twin"]
        assert len(twin) == 2 and all(("eager_turns_s" in r.metrics) is turns for r in twin), where
        assert "took their eager times in turns and" not in told.getvalue()


def test_a_tune_stops_where_the_stores_library_baseline_is_missing(tmp_path, toy, monkeypatch):
    """A store measured against a library baseline, tuned again where its package is missing: the
    reference would stand in as the baseline (timed as it, the new rows' eager turns paired with it), so
    the tune stops before measuring and says why, unless told to let it stand in."""
    import io

    def library_baseline(requires):
        registry.unregister(NAME, "toy_library")
        registry.variant(NAME, "toy_library", backend="library", archs=("*",), requires=requires,
                         baseline=True)(lambda x, alpha: x * alpha)

    library_baseline(("torch",))
    try:
        store = tmp_path / "store" / "cpu.sqlite"
        kw = dict(definitions=["toy_scale"], device="cpu", env=ENV, store=store, quick=True, compile_routers=False)
        write_traces(tmp_path, (2,))
        flows.tune(tmp_path / "traces", stream=open(os.devnull, "w"), **kw)
        assert {r.variant for r in Store.open(store).results(NAME) if r.baseline} == {"toy_library"}
        write_traces(tmp_path / "later", (2, 5))
        planned = io.StringIO()  # planning from another machine names the baseline and what it needs there
        flows.pending(tmp_path / "later" / "traces", definitions=["toy_scale"], device="cpu", store=store, stream=planned)
        assert "toy_scale: 2 (toy_fast 1, toy_library 1); baseline toy_library (needs torch)" in planned.getvalue()
        library_baseline(("kd_no_such_package",))
        with pytest.raises(flows.StandInBaseline, match=r"measured against toy_library, which does not run here "
                                                         r"\(missing package kd_no_such_package\); reference would stand in"):
            flows.tune(tmp_path / "later" / "traces", stream=open(os.devnull, "w"), **kw)
        assert len(Store.open(store).results(NAME)) == 2, "nothing measured"
        monkeypatch.setattr(sys, "argv", ["kdispatch", "tune", "--workloads", str(tmp_path / "later" / "traces"),
                                          "--definitions", "toy_scale", "--device", "cpu", "--store", str(store)])
        monkeypatch.setattr(flows, "detect_environment", lambda devices: ENV)
        from kdispatch import cli as main_cli
        with pytest.raises(SystemExit) as stopped:
            main_cli.main()
        assert stopped.value.code == 2
        # let it stand in: the reference timed as the baseline on every workload
        flows.tune(tmp_path / "later" / "traces", stand_in=True, stream=open(os.devnull, "w"), **kw)
        assert {(r.variant, r.uuid) for r in Store.open(store).results(NAME) if r.baseline} == {
            ("toy_library", "toy-2"), ("reference", "toy-2"), ("reference", "toy-5")}
        # nothing pending (the stored workload), or a store never measured against it: no stop
        flows.tune(tmp_path / "traces", stream=open(os.devnull, "w"), **kw)
        flows.tune(tmp_path / "later" / "traces", stream=open(os.devnull, "w"),
                   **{**kw, "store": tmp_path / "fresh" / "cpu.sqlite"})
    finally:
        registry.unregister(NAME, "toy_library")


def test_a_tune_warns_of_a_mix_only_on_the_workloads_of_its_sets(tmp_path, toy):
    """Rows of a workload since dropped from the sets are neither fitted by `route` nor retaken by
    `--eager-turns-only`: a tune that measures in turns does not count them as a mix (its advice to
    retake would take nothing)."""
    import dataclasses
    import io

    write_traces(tmp_path, (2, 5))
    store = tmp_path / "store" / "cpu.sqlite"
    kw = dict(definitions=["toy_scale"], device="cpu", env=ENV, store=store, out=tmp_path / "routers", quick=True,
              eager_turns=True, compile_routers=False)
    flows.tune(tmp_path / "traces", stream=open(os.devnull, "w"), **kw)
    row = Store.open(store).results(NAME)[0]
    Store.open(store).put(dataclasses.replace(row, uuid=row.uuid + "-dropped", metrics={
        k: v for k, v in row.metrics.items() if k != "eager_turns_s"}))  # an own-loop row, not in the sets
    with extra_variants("toy_twin"):
        told = io.StringIO()
        flows.tune(tmp_path / "traces", stream=told, **kw)
    assert "took their eager times in turns" not in told.getvalue()


def test_eager_turns_only_retakes_the_stores_eager_times_in_turns(tmp_path, toy):
    """`tune --eager-turns-only` takes the eager times of a store's passing rows again, in turns (no
    gate, no graph timing): a definition of own-loop rows becomes one of turns, resumably; a workload
    whose turns fail keeps its rows as they were, and says so."""
    import dataclasses
    import io

    write_traces(tmp_path, (2, 5))
    store = tmp_path / "store" / "cpu.sqlite"
    kw = dict(definitions=["toy_scale"], device="cpu", env=ENV, store=store, out=tmp_path / "routers", quick=True)
    flows.tune(tmp_path / "traces", stream=open(os.devnull, "w"), **kw)
    before = {(r.variant, r.uuid): r for r in Store.open(store).results(NAME) if r.status == "PASSED"}
    assert before and not any("eager_turns_s" in r.metrics for r in before.values())
    planned = flows.pending(tmp_path / "traces", definitions=["toy_scale"], device="cpu", store=store,
                            stream=io.StringIO(), eager_only=True)[NAME]  # `tune --pending --eager-turns-only`
    assert sum(planned.values()) == len(before)
    said = io.StringIO()
    result = flows.tune(tmp_path / "traces", eager_only=True, stream=said, **kw)
    after = {(r.variant, r.uuid): r for r in Store.open(store).results(NAME) if r.status == "PASSED"}
    assert set(after) == set(before) and len(result.measured) == len(before)
    for key, r in after.items():
        assert "eager_turns_s" in r.metrics and r.measured_at >= before[key].measured_at
        # the baseline is what the others' calls are paired with
        assert ("eager_paired" in r.metrics) == (r.variant != registry.baseline(NAME, "cpu").name)
        assert r.metrics["trials"] == before[key].metrics["trials"]  # the gate's metrics stay
    assert "eager times in turns and" not in said.getvalue()  # route finds no mix
    assert not flows.tune(tmp_path / "traces", eager_only=True, stream=io.StringIO(), **kw).measured  # nothing left
    assert not flows.pending(tmp_path / "traces", definitions=["toy_scale"], device="cpu", store=store,
                             stream=io.StringIO(), eager_only=True)[NAME]

    broken = {"on": False}

    def flaky(x, alpha):
        if broken["on"]:
            raise RuntimeError("flaky")
        return x * alpha

    registry.variant(NAME, "toy_flaky", backend="torch", archs=("*",))(flaky)
    try:
        flows.tune(tmp_path / "traces", stream=open(os.devnull, "w"), **kw)  # the new variant, in turns
        for r in Store.open(store).results(NAME):  # its rows as own-loop ones, for the retake to take
            if r.variant == "toy_flaky":
                Store.open(store).put(dataclasses.replace(r, metrics={
                    k: v for k, v in r.metrics.items() if k not in ("eager_turns_s", "eager_paired")}))
        broken["on"] = True
        said = io.StringIO()
        flows.tune(tmp_path / "traces", eager_only=True, stream=said, **kw)
    finally:
        registry.unregister(NAME, "toy_flaky")
    assert "eager turns failed: RuntimeError: flaky; its rows keep their eager times" in said.getvalue()
    assert not any("eager_turns_s" in r.metrics for r in Store.open(store).results(NAME) if r.variant == "toy_flaky")


def test_a_forced_retake_cut_short_resumes_from_its_start(tmp_path, toy):
    """`tune --eager-turns-only --force` takes every workload again; `--retake-before T` takes those with
    a row measured before T, so a forced retake stopped by --max-minutes resumes where it stopped."""
    import sqlite3

    from kdispatch.tuner.cli import _utc

    write_traces(tmp_path, (2, 5, 9))
    store = tmp_path / "store" / "cpu.sqlite"
    kw = dict(definitions=["toy_scale"], device="cpu", env=ENV, store=store, out=tmp_path / "routers", quick=True)
    flows.tune(tmp_path / "traces", eager_turns=True, stream=open(os.devnull, "w"), **kw)  # all in turns

    def pending(**how):
        return sum(flows.pending(tmp_path / "traces", definitions=["toy_scale"], device="cpu", store=store,
                                 stream=io.StringIO(), eager_only=True, **how)[NAME].values())

    rows = [r for r in Store.open(store).results(NAME) if r.status == "PASSED"]
    assert pending() == 0 and pending(force=True) == len(rows)
    # one workload's rows taken before the others' (a retake cut short after the other two); the rows'
    # times set, not read: a tune crossing a second boundary would put some of the others before `late`
    late = "2026-06-01T00:00:00Z"
    early = rows[0].uuid
    with sqlite3.connect(store) as db:
        db.execute("UPDATE result SET measured_at = ? WHERE definition = ?", (late, NAME))
        db.execute("UPDATE result SET measured_at = '2026-01-01T00:00:00Z' WHERE definition = ? AND uuid = ?",
                   (NAME, early))
    assert pending(retake_before=late) == sum(r.uuid == early for r in rows)
    assert pending(retake_before="2025-12-31T23:59:59Z") == 0
    flows.tune(tmp_path / "traces", eager_only=True, retake_before=late, stream=open(os.devnull, "w"), **kw)
    assert pending(retake_before=late) == 0  # the workload taken again is now as late as the others
    assert _utc("2026-11-29 23:02:00+01:00") == _utc("2026-11-29T22:02:00") == "2026-11-29T22:02:00Z"
    # what a tune that stopped early says: a forced retake names its start, since --force would begin again
    t = "2026-11-29T22:02:55Z"
    assert "re-run the same command" in flows.resume_advice(3, force=False, retake_before=None, started=t)
    assert f"without --force, with --retake-before {t}" in flows.resume_advice(3, force=True, retake_before=None,
                                                                                started=t)
    assert "--retake-before 2026-11-29T21:00:00Z" in flows.resume_advice(3, force=True, started=t,
                                                                         retake_before="2026-11-29T21:00:00Z")
    assert flows.resume_advice(0, force=True, retake_before=None, started=t) == ""
    from kdispatch.cli import main

    for args in (["--retake-before", late], ["--eager-turns-only", "--retake-before", "late"]):
        with pytest.raises(SystemExit) as stop:  # without --eager-turns-only; not a time
            main(["tune", "--workloads", str(tmp_path / "traces"), "--store", str(store), *args])
        assert stop.value.code == 2


def test_a_job_takes_its_variants_eager_times_in_turns(toy):
    """Two variants, the second 4 ms slower a call: their eager times come from the turns (after the
    workload's variants, its own progress message), and the second's calls over the first's of the
    same round (the job's baseline here) are > 1 (`eager_paired`, what the eager fit compares)."""
    import time

    from kdispatch.tuner import job
    from kdispatch.tuner.job import Job, run_job

    registry.variant(NAME, "toy_slow", backend="torch", archs=("*",))(lambda x, alpha: (time.sleep(0.001), x * alpha)[1])
    registry.variant(NAME, "toy_slower", backend="torch", archs=("*",))(lambda x, alpha: (time.sleep(0.005), x * alpha)[1])
    rows, starts = [], []
    try:
        work = Job(NAME, [{"uuid": "toy-turns", "axes": {"num_rows": 3}, "inputs": {}}],
                   {"toy-turns": ["toy_slow", "toy_slower"]}, device="cpu", quick=True,
                   extra={"eager_turns": True, "baseline": "toy_slow"})
        run_job(work, lambda kind, *p: rows.append(p[0]) if kind == "result" else starts.append(p))
    finally:
        registry.unregister(NAME, "toy_slow")
        registry.unregister(NAME, "toy_slower")
    by = {r["variant"]: r for r in rows}
    assert all("eager_turns_s" in r["metrics"] for r in rows), [(r["variant"], r["status"], r["reason"]) for r in rows]
    assert [(n, u) for n, u, *_ in starts if n == job.EAGER_TURNS] == [(job.EAGER_TURNS, "toy-turns")]
    assert by["toy_slower"]["eager_us"] > by["toy_slow"]["eager_us"] + 2000
    assert by["toy_slower"]["median_us"] == by["toy_slower"]["eager_us"]  # on the CPU the eager time is the time
    paired = by["toy_slower"]["metrics"]["eager_paired"]  # each call over the baseline's of its round
    assert paired["baseline"] == "toy_slow" and paired["median"] > 1.5 and paired["p90"] >= paired["median"]
    assert "eager_paired" not in by["toy_slow"]["metrics"]


def test_a_job_without_the_baseline_pairs_its_rows_with_the_baselines_calls(toy):
    """A tune of one new variant (the baseline measured earlier, not pending): the baseline's call
    still takes the turns, so the new row is paired with it (`eager_paired`, 4 ms slower a call:
    ratio > 1.5), and no baseline row is emitted. A baseline that raises on the workload leaves the
    row unpaired rather than failing the turns."""
    import time

    from kdispatch.tuner.job import Job, run_job

    registry.variant(NAME, "toy_base", backend="torch", archs=("*",))(lambda x, alpha: (time.sleep(0.001), x * alpha)[1])
    registry.variant(NAME, "toy_new", backend="torch", archs=("*",))(lambda x, alpha: (time.sleep(0.005), x * alpha)[1])

    def broken(x, alpha):
        raise RuntimeError("cannot take this shape")

    registry.variant(NAME, "toy_broken_base", backend="torch", archs=("*",))(broken)
    runs = {}
    try:
        for base in ("toy_base", "toy_broken_base"):
            rows = []
            work = Job(NAME, [{"uuid": "toy-companion", "axes": {"num_rows": 3}, "inputs": {}}],
                       {"toy-companion": ["toy_new"]}, device="cpu", quick=True,
                       extra={"eager_turns": True, "baseline": base})
            run_job(work, lambda kind, *p: rows.append(p[0]) if kind == "result" else None)
            runs[base] = rows
    finally:
        for n in ("toy_base", "toy_new", "toy_broken_base"):
            registry.unregister(NAME, n)
    (row,) = runs["toy_base"]
    assert row["variant"] == "toy_new" and "eager_turns_s" in row["metrics"], row
    paired = row["metrics"]["eager_paired"]
    assert paired["baseline"] == "toy_base" and paired["median"] > 1.5, paired
    (row,) = runs["toy_broken_base"]
    assert row["variant"] == "toy_new" and row["status"] == "PASSED" and "eager_turns_s" in row["metrics"], row
    assert "eager_paired" not in row["metrics"]


def test_a_tune_of_a_new_variant_pairs_its_eager_rows_and_route_warns_of_unpaired_ones(tmp_path, toy):
    """A turns tune of a variant registered after the first tune (the baseline's rows already stored)
    still pairs its eager rows with the baseline's calls, so `route` finds nothing unpaired; a turns
    row without its pairing (as tunes before the baseline's companion stored them) gets a warning
    naming the retake."""
    import dataclasses
    import io

    write_traces(tmp_path, (2, 5))
    store = tmp_path / "store" / "cpu.sqlite"
    kw = dict(definitions=["toy_scale"], device="cpu", env=ENV, store=store, out=tmp_path / "routers", quick=True,
              eager_turns=True, stream=open(os.devnull, "w"))
    flows.tune(tmp_path / "traces", **kw)
    with extra_variants("toy_twin"):
        flows.tune(tmp_path / "traces", **kw)
        twin = [r for r in Store.open(store).results(NAME) if r.variant == "toy_twin"]
        assert twin and all(r.metrics["eager_paired"]["baseline"] != "toy_twin" for r in twin), twin
        said = io.StringIO()
        flows.compile_all(Store.open(store), tmp_path / "routers", "cpu", ["toy_scale"], stream=said)
        assert "without the baseline's call" not in said.getvalue()
        Store.open(store).put(dataclasses.replace(twin[0], metrics={
            k: v for k, v in twin[0].metrics.items() if k != "eager_paired"}))
        said = io.StringIO()
        flows.compile_all(Store.open(store), tmp_path / "routers", "cpu", ["toy_scale"], stream=said)
        assert "toy_scale on CPU: 1 rows took their eager times in turns without the baseline's call" in said.getvalue()
        assert "`kdispatch tune --eager-turns-only --definitions toy_scale`" in said.getvalue()
        # what the warning names takes that row again alone, the baseline's call for company, and pairs it
        pend = flows.pending(tmp_path / "traces", definitions=["toy_scale"], device="cpu", store=store,
                             stream=io.StringIO(), eager_only=True)[NAME]
        assert pend == {"toy_twin": 1}, pend
        base_rows = {r.uuid: r for r in Store.open(store).results(NAME) if r.variant != "toy_twin"}
        flows.tune(tmp_path / "traces", **{**kw, "eager_turns": False}, eager_only=True)
        retaken = next(r for r in Store.open(store).results(NAME) if (r.variant, r.uuid) == ("toy_twin", twin[0].uuid))
        assert retaken.metrics["eager_paired"]["baseline"] == registry.baseline(NAME, "cpu").name
        assert {r.uuid: r for r in Store.open(store).results(NAME) if r.variant != "toy_twin"} == base_rows
        assert not flows.pending(tmp_path / "traces", definitions=["toy_scale"], device="cpu", store=store,
                                 stream=io.StringIO(), eager_only=True)[NAME]
        forced = [flows.pending(tmp_path / "traces", definitions=["toy_scale"], device="cpu", store=store,
                                stream=io.StringIO(), eager_only=True, force=True, **only)[NAME]
                  for only in ({}, {"variants": ["toy_twin"]})]
        assert set(forced[1]) == {"toy_twin", registry.baseline(NAME, "cpu").name} < set(forced[0]), forced


def test_eager_turns_only_retakes_a_minority_of_own_loop_rows_alone_with_the_baseline(tmp_path, toy):
    """On a workload mostly in turns, the rows of own loops (a variant re-measured before tunes took
    new rows in turns) are taken again alone, the baseline's call for company, and paired with it; where
    own loops are half of the rows or more, the workload is taken again whole."""
    import dataclasses
    import io

    write_traces(tmp_path, (2, 5))
    store = tmp_path / "store" / "cpu.sqlite"
    kw = dict(definitions=["toy_scale"], device="cpu", env=ENV, store=store, quick=True, compile_routers=False,
              stream=open(os.devnull, "w"))
    with extra_variants("toy_twin", "toy_new"):
        flows.tune(tmp_path / "traces", eager_turns=True, **kw)

        def as_own_loops(names):
            for r in Store.open(store).results(NAME):
                if r.variant in names:
                    Store.open(store).put(dataclasses.replace(r, metrics={
                        k: v for k, v in r.metrics.items() if k not in ("eager_turns_s", "eager_paired")}))

        def pending():
            return flows.pending(tmp_path / "traces", definitions=["toy_scale"], device="cpu", store=store,
                                 stream=io.StringIO(), eager_only=True)[NAME]

        as_own_loops({"toy_twin"})  # one row of four a workload
        assert pending() == {"toy_twin": 2}
        others = {(r.variant, r.uuid): r for r in Store.open(store).results(NAME) if r.variant != "toy_twin"}
        flows.tune(tmp_path / "traces", eager_only=True, **kw)
        twin = [r for r in Store.open(store).results(NAME) if r.variant == "toy_twin"]
        assert len(twin) == 2 and all(r.metrics["eager_paired"]["baseline"] == registry.baseline(NAME, "cpu").name
                                      for r in twin)
        assert {(r.variant, r.uuid): r for r in Store.open(store).results(NAME) if r.variant != "toy_twin"} == others
        assert not pending()
        as_own_loops({"toy_twin", "toy_new"})  # half of them: the workloads whole
        assert pending() == {"reference": 2, "toy_fast": 2, "toy_twin": 2, "toy_new": 2}
