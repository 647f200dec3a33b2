"""What the CP prefill's idle blocks cost (kernels/cuda/gdn/prefill_cp.cu's IDLE): on equal-length batches
that the plan leaves unsplit, each CP kernel's device time per call with the grids cp_bounds sizes, with
no room for extra segments (e_max forced to 0: the walk's grid holds the working blocks alone), and with
EXTRA more idle blocks; the staged walk beside it (benchmarks/results/cp-plan-ab-H200.txt).

    python benchmarks/cp_idle_blocks.py [--definition gdn_prefill_pool_qk2_v4] [--shapes 16x8192 8x2048 16x1024]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from hosttime import kernel_times  # noqa: E402
from kdispatch import definitions, registry  # noqa: E402
from kdispatch.definitions.gdn.spec import prefill_mix  # noqa: E402
from kdispatch.kernels.cuda.gdn import prefill_cp as pc  # noqa: E402
from kdispatch.workloads import SimpleWorkload, materialize  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--definition", default="gdn_prefill_pool_qk2_v4")
    ap.add_argument("--shapes", nargs="+", default=["16x8192", "8x2048", "16x1024"], help="SEQSxTOKENS, equal lengths")
    ap.add_argument("--extra", type=int, default=1000, help="extra segments' room beyond the bound")
    opts = ap.parse_args()
    registry.discover()
    d = definitions.resolve_name(opts.definition)
    cp, staged = registry.get(d, "cuda_prefill_cp.p4"), registry.get(d, "cuda_prefill_staged.r32s4")
    bound = pc.cp_bounds
    arms = {"bounds": bound, "no extra": lambda *a: (0, 0),
            f"+{opts.extra} extra": lambda *a: (bound(*a)[0] + opts.extra, bound(*a)[1])}
    print(f"# {torch.cuda.get_device_name()}: device us per call of each kernel ({d})")
    for shape in opts.shapes:
        n, t = map(int, shape.split("x"))
        axes = {"num_seqs": n, "total_seq_len": t, "len_cu_seqlens": n + 1}
        if "num_slots" in definitions.get(d).var_axes:
            axes["num_slots"] = n + 1
        args = list(materialize(d, SimpleWorkload(axes, uuid=f"idle-{shape}"), device="cuda", seed=1))
        cu = prefill_mix(axes, "equal", torch.Generator())["cu_seqlens"]
        args[list(definitions.get(d).inputs).index("cu_seqlens")].copy_(cu)
        fresh = lambda: [a.clone() if torch.is_tensor(a) else a for a in args]  # noqa: E731
        walk = kernel_times(staged.fn, fresh())
        for label, sizing in arms.items():
            pc.cp_bounds = sizing
            try:
                parts = kernel_times(cp.fn, fresh())
            finally:
                pc.cp_bounds = bound
            print(f"{shape:>9} equal {label:>12}: " + ", ".join(f"{k.split('(')[0]} {v:.1f}" for k, v in parts.items())
                  + "   staged: " + ", ".join(f"{k.split('(')[0]} {v:.1f}" for k, v in walk.items()))


if __name__ == "__main__":
    main()
