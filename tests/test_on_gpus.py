"""benchmarks/on_gpus.sh without GPUs (KD_GPUS stands in for nvidia-smi): each command runs with its
own CUDA_VISIBLE_DEVICES, all at once, logs in $OUT/gpu<i>.log; a failing step fails the call and
the others still run to the end; more commands than GPUs is refused before anything runs."""
import shutil
import subprocess
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "on_gpus.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(tmp_path, gpus, *cmds):
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "KD_GPUS": str(gpus)}
    return subprocess.run(["bash", str(SCRIPT), *cmds], env=env, capture_output=True, text=True, timeout=60)


def test_each_command_gets_its_own_gpu_at_once(tmp_path):
    t0 = time.monotonic()
    p = _run(tmp_path, 3, 'sleep 1; echo "a on $CUDA_VISIBLE_DEVICES"', 'sleep 1; echo "b on $CUDA_VISIBLE_DEVICES"')
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 1.9  # together, not one after the other
    assert (tmp_path / "gpu0.log").read_text() == "a on 0\n"
    assert (tmp_path / "gpu1.log").read_text() == "b on 1\n"
    assert "== GPU 1, exit 0" in p.stdout and "b on 1" in p.stdout


def test_a_failing_step_fails_the_call_and_the_others_finish(tmp_path):
    p = _run(tmp_path, 2, "echo broken; exit 4", "sleep 0.5; echo done")
    assert p.returncode == 1
    assert "== GPU 0, exit 4" in p.stdout and "== GPU 1, exit 0" in p.stdout
    assert (tmp_path / "gpu1.log").read_text() == "done\n"


def test_more_commands_than_gpus_is_refused(tmp_path):
    p = _run(tmp_path, 1, "touch ran0", "touch ran1")
    assert p.returncode == 2 and "2 commands for 1 GPU" in p.stderr
    assert not list(tmp_path.glob("gpu*.log"))
