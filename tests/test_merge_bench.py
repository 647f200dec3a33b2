"""benchmarks/merge_bench.py: a part's definitions replace the full file's, others stay; files of two
environments or an unfinished part are refused."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import merge_bench  # noqa: E402


def bench(env, rows, complete=True):
    return {"env": env, "complete": complete, "summary": {d: {"workloads": n} for d, n in rows.items()},
            "results": [{"definition": d, "uuid": f"{d}-{i}", "env": env} for d, n in rows.items() for i in range(n)]}


def test_the_part_replaces_its_definitions(tmp_path):
    full, part = tmp_path / "full.json", tmp_path / "part.json"
    full.write_text(json.dumps(bench("e1", {"a": 2, "b": 3})))
    part.write_text(json.dumps(bench("e1", {"b": 1, "c": 2})))
    assert merge_bench.main([str(full), str(part)]) == 0
    got = json.loads(full.read_text())
    assert got["summary"] == {"a": {"workloads": 2}, "b": {"workloads": 1}, "c": {"workloads": 2}}
    assert sorted(r["uuid"] for r in got["results"]) == ["a-0", "a-1", "b-0", "c-0", "c-1"]


def test_every_part_given_is_merged(tmp_path):
    full, one, two = tmp_path / "full.json", tmp_path / "one.json", tmp_path / "two.json"
    full.write_text(json.dumps(bench("e1", {"a": 2, "b": 3})))
    one.write_text(json.dumps(bench("e1", {"a": 1})))
    two.write_text(json.dumps(bench("e1", {"b": 1})))
    assert merge_bench.main([str(full), str(one), str(two)]) == 0
    assert json.loads(full.read_text())["summary"] == {"a": {"workloads": 1}, "b": {"workloads": 1}}


def test_a_missing_part_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        merge_bench.main([str(tmp_path / "full.json")])


@pytest.mark.parametrize("part", [bench("e2", {"a": 1}), bench("e1", {"a": 1}, complete=False)])
def test_other_environments_and_unfinished_parts_are_refused(part):
    with pytest.raises(SystemExit):
        merge_bench.merge(bench("e1", {"a": 2}), part)
