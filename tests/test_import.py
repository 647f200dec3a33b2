"""`import kdispatch` (and its ops) stays light: heavy or optional packages load only when used."""
import subprocess
import sys

CODE = """
import sys, time
import torch
before = set(sys.modules)  # torch itself may load parts of cuda-python
t0 = time.perf_counter()
import kdispatch, kdispatch.ops
dt = time.perf_counter() - t0
heavy = sorted({m.split('.')[0] for m in set(sys.modules) - before} & {'triton', 'flashinfer', 'flashinfer_bench', 'fla',
                                                      'cuda', 'sklearn', 'pydantic', 'openai', 'cutlass'})
print(dt, ','.join(heavy))
"""


def test_import_is_fast_and_lazy():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout.split()
    seconds, heavy = float(out[0]), out[1] if len(out) > 1 else ""
    assert heavy == "", f"import kdispatch pulled in {heavy}"
    assert seconds < 1.0, f"import kdispatch took {seconds:.2f} s beyond torch"
