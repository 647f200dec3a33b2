"""KD_TEST_SHARD (tests/conftest.py): the shards of a suite partition it, and a malformed value is refused."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = "tests/test_shards_sample.py"


def collected(shard: str | None) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "KD_TEST_SHARD"}
    if shard is not None:
        env["KD_TEST_SHARD"] = shard
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", SUITE],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    return run.returncode, [line for line in run.stdout.splitlines() if "::" in line]


def test_shards_partition_the_suite():
    _, everything = collected(None)
    shards = [collected(f"{i}/2")[1] for i in range(2)]
    assert len(everything) == 7
    assert sorted(sum(shards, [])) == sorted(everything)
    assert sorted(map(len, shards)) == [3, 4]


def test_a_malformed_shard_is_refused():
    code, _ = collected("2/2")
    assert code != 0
