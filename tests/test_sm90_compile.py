"""The Triton kernels compile for sm_90 with no GPU here (tests/sm90_compile.py, in a subprocess: this
session interprets its kernels), and that check fails on a kernel the interpreter runs but the
compiler rejects."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia")

HERE = Path(__file__).resolve().parent
ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def _run(args, **kw):
    return subprocess.run([sys.executable, *args], env=ENV, capture_output=True, text=True, timeout=900, **kw)


def test_every_triton_variant_compiles_for_sm90(tmp_path):
    sys.path.insert(0, str(HERE))
    try:
        from sm90_compile import SHAPES
    finally:
        sys.path.remove(str(HERE))
    # Two processes where two cores are: the MoE kernels take about half of the compiles (~2 of ~4
    # minutes on a 2-core CPU machine, 2026-11-30), everything else the other half.
    groups = [["moe_fp8"], [s for s in SHAPES if s != "moe_fp8"]] if (os.cpu_count() or 1) > 1 else [list(SHAPES)]
    procs = [subprocess.Popen([sys.executable, str(HERE / "sm90_compile.py"), "--json",
                               str(tmp_path / f"sm90-{i}.json"), "--definitions", *group],
                              cwd=HERE.parent, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, group in enumerate(groups)]
    outputs = [proc.communicate(timeout=900) for proc in procs]
    results = {}
    for i, (proc, (_, err)) in enumerate(zip(procs, outputs)):
        assert (tmp_path / f"sm90-{i}.json").is_file(), err[-3000:]
        results.update(json.loads((tmp_path / f"sm90-{i}.json").read_text()))
        failed = {name: r["compile_error"] for name, r in results.items() if r["compile_error"]}
        assert proc.returncode == 0 and not failed, failed or err[-3000:]
    compiled = {name.split("/")[0] for name, r in results.items() if r["kernels"]}
    assert compiled == set(SHAPES), f"no kernel compiled for {set(SHAPES) - compiled}"


def test_a_kernel_the_interpreter_runs_but_the_compiler_rejects_is_caught(tmp_path):
    """A name bound to a pointer, then to a tensor in a branch: fine interpreted, a type clash compiled."""
    (tmp_path / "kernels_under_test.py").write_text(textwrap.dedent('''
        import triton
        import triton.language as tl

        @triton.jit
        def clashing(x_ptr, N: tl.constexpr):
            _ = x_ptr
            if tl.program_id(0) == 0:
                _ = tl.arange(0, N) > 3
            tl.store(x_ptr + tl.arange(0, N), 1.0)

        @triton.jit
        def fine(x_ptr, N: tl.constexpr):
            tl.store(x_ptr + tl.arange(0, N), 1.0)
    '''))
    script = textwrap.dedent(f'''
        import sys
        sys.path[:0] = [{str(HERE)!r}, {str(tmp_path)!r}]
        import torch
        import sm90_compile
        compiles = sm90_compile.install()
        import kernels_under_test as k
        k.fine[(1,)](torch.empty(8), 8)
        print("fine:", compiles.kernels, compiles.error)
        try:
            k.clashing[(1,)](torch.empty(8), 8)
        except Exception:
            pass
        print("clashing:", compiles.error)
    ''')
    proc = _run(["-c", script])
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert lines.get("fine") == "['fine'] None", proc.stdout + proc.stderr[-2000:]
    assert "clashing: CompilationError" in lines.get("clashing", ""), proc.stdout + proc.stderr[-2000:]
