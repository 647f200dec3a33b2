"""benchmarks/twin_diff.py: a variant's rows in two versions of a store's twin, pair by pair; rows of the
new twin count only where measured after the old one's, and failed rows not at all."""
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import twin_diff  # noqa: E402


def twin(path, rows):
    lines = [{"definition": d, "solution": v, "workload": {"uuid": u, "axes": {"total_seq_len": t}},
              "evaluation": {"status": status, "timestamp": when}, "kdispatch": {"median_us": us}}
             for d, v, u, t, us, when, status in rows]
    path.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    return str(path)


def test_each_shared_pair_compared_and_binned(tmp_path, capsys):
    old = twin(tmp_path / "old.jsonl.gz", [
        ("gdn_prefill_x", "walk.a", "u1", 100, 10.0, "2026-12-01T00:00:00Z", "PASSED"),
        ("gdn_prefill_x", "walk.a", "u2", 4000, 100.0, "2026-12-01T00:00:00Z", "PASSED"),
        ("gdn_prefill_x", "walk.a", "u3", 4000, 50.0, "2026-12-01T00:00:00Z", "PASSED"),
        ("gdn_decode_y", "walk.a", "u1", 100, 5.0, "2026-12-01T00:00:00Z", "PASSED")])
    new = twin(tmp_path / "new.jsonl.gz", [
        ("gdn_prefill_x", "walk.a", "u1", 100, 11.0, "2026-12-03T00:00:00Z", "PASSED"),
        ("gdn_prefill_x", "walk.a", "u2", 4000, 80.0, "2026-12-03T00:00:00Z", "PASSED"),
        ("gdn_prefill_x", "walk.a", "u3", 4000, 1.0, "2026-12-03T00:00:00Z", "INCORRECT_NUMERICAL"),
        ("gdn_prefill_x", "walk.a", "u4", 100, 1.0, "2026-12-03T00:00:00Z", "PASSED"),  # not in the old twin
        ("gdn_decode_y", "walk.a", "u1", 100, 50.0, "2026-12-03T00:00:00Z", "PASSED")])
    twin_diff.main(["--old", old, "--new", new, "--definitions", "prefill", "--by", "total_seq_len",
                    "--edges", "256"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("gdn_prefill_x"))
    assert row.split()[2:4] == ["2", "0.950"], row  # u1 1.1, u2 0.8: two pairs, their median
    assert "gdn_decode_y" not in out
    bins = [line.split() for line in out.splitlines() if line.startswith("total_seq_len ")]
    assert bins == [["total_seq_len", "<", "256", "1", "1.100", "1.100", "1.100"],
                    ["total_seq_len", ">=", "256", "1", "0.800", "0.800", "0.800"]]
