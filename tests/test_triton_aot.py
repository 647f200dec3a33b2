"""Triton kernels compile for sm_90 without a GPU (Triton's ahead-of-time compiler, ptxas from its
wheel), in a subprocess without TRITON_INTERPRET: a kernel that the interpreter runs may still fail
to lower (control flow, layouts, dtypes), and finding that on the GPU machine costs a session's
device time. Kernels with their argument types and constants below; the newest (not yet measured)
ones first."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]

# (module, kernel, signature, constexprs, num_warps)
KERNELS = [
    ("kdispatch.kernels.triton.gdn.decode_pool", "_gdn_decode_pool_kernel",
     {"qkv_ptr": "*bf16", "a_ptr": "*bf16", "b_ptr": "*bf16", "A_log_ptr": "*fp32", "dt_bias_ptr": "*fp32",
      "pool_ptr": "*fp32", "slots_ptr": "*i32", "out_ptr": "*bf16", "scale": "fp32", "num_slots": "i32",
      "s_row": "i32", "s_ab": "i32", "s_bb": "i32", "s_slot": "i64", "s_head": "i32", "s_vrow": "i32"},
     {"HQ": 16, "HV": 32, "D": 128, "BV": 32, "STREAM": False}, 1),
    ("kdispatch.kernels.triton.gdn.decode_pool", "_gdn_decode_pool_kernel",
     {"qkv_ptr": "*bf16", "a_ptr": "*bf16", "b_ptr": "*bf16", "A_log_ptr": "*fp32", "dt_bias_ptr": "*fp32",
      "pool_ptr": "*fp32", "slots_ptr": "*i32", "out_ptr": "*bf16", "scale": "fp32", "num_slots": "i32",
      "s_row": "i32", "s_ab": "i32", "s_bb": "i32", "s_slot": "i64", "s_head": "i32", "s_vrow": "i32"},
     {"HQ": 2, "HV": 4, "D": 128, "BV": 8, "STREAM": True}, 1),
    ("kdispatch.kernels.library.moe.deepgemm_fused", "_gather_rows_kernel",
     {"x_ptr": "*u8", "x_scale_ptr": "*fp32", "row_pair_ptr": "*i32", "block_expert_ptr": "*i32", "a_ptr": "*u8",
      "a_scale_ptr": "*fp32", "m_indices_ptr": "*i32", "pair_row_ptr": "*i32", "num_tokens": "i32",
      "num_rows": "i32"},
     {"HIDDEN": 7168, "TOP_K": 8, "NUM_LOCAL": 32, "BLOCK_M": 128, "ROWS": 16, "COLS": 1024, "KB": 56,
      "KB_POW2": 64}, 4),
    ("kdispatch.kernels.library.moe.deepgemm_fused", "_silu_mul_quant_kernel",
     {"h_ptr": "*bf16", "block_expert_ptr": "*i32", "y_ptr": "*fp8e4nv", "y_scale_ptr": "*fp32", "num_rows": "i32"},
     {"INTER": 2048, "NUM_LOCAL": 32, "BLOCK_M": 128, "ROWS": 16, "QB": 128, "ON_GRID": False}, 4),
    ("kdispatch.kernels.library.moe.deepgemm_fused", "_psum_kernel",
     {"row_pair_ptr": "*i32", "block_expert_ptr": "*i32", "psum_ptr": "*i32", "num_blocks": "i32"},
     {"NUM_LOCAL": 32, "BLOCK_M": 128, "CHUNK": 1024}, 4),
    ("kdispatch.kernels.library.moe.deepgemm_fused", "_combine_kernel",
     {"d_ptr": "*bf16", "pair_row_ptr": "*i32", "pair_weight_ptr": "*fp32", "out_ptr": "*bf16"},
     {"HIDDEN": 7168, "TOP_K": 8, "COLS": 1024}, 4),
]

COMPILE = """
import importlib, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
failed = []
for module, name, signature, constants, warps in json.loads(sys.argv[1]):
    fn = getattr(importlib.import_module(module), name)
    signature = {**signature, **{k: "constexpr" for k in constants}}
    try:
        triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": warps})
    except Exception as exc:
        failed.append(f"{module}.{name} {constants}: {type(exc).__name__}: {str(exc)[:2000]}")
print("\\n".join(failed) or "all compiled")
sys.exit(1 if failed else 0)
"""


def test_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton >= 3.9 warns without it; the GPU machine's default
    r = subprocess.run([sys.executable, "-c", COMPILE, json.dumps(KERNELS)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    if r.returncode and "all compiled" not in r.stdout and "ptxas" in r.stderr and "not found" in r.stderr:
        pytest.skip(f"no ptxas here: {r.stderr[-300:]}")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
