"""Launch-configuration sweep of the chunked GDN prefill's two kernels
(kernels/triton/gdn/prefill_chunked.py), pool convention: the WY kernel at several warps / stages
and the scan at several (BV rows, warps, stages), each timed alone, over head counts and
(sequences x tokens) shapes. Graph replays of do_bench_cudagraph on one input set (L2-warm: a
profile for choosing configurations, not the tuner's measurement). GPU only.

    python benchmarks/gdn_chunked_sweep.py [--heads 4 8 16 32] [--shapes 1x256 4x512 ...] > out.txt

The scan at num_stages=1 faults (Triton 3.6; see the kernel's docstring): it is not swept.
"""
from __future__ import annotations

import argparse

import torch
import triton
from triton.testing import do_bench_cudagraph

from kdispatch.definitions.gdn.names import pool_prefill_name
from kdispatch.kernels.triton.gdn import prefill_chunked as C
from kdispatch.workloads import materialize

SHAPES = ("1x256", "4x512", "64x512", "16x2048", "64x8192", "1x8192")
WY = ((8, 1), (4, 1), (4, 2), (2, 1))  # (warps, stages)
SCAN = ((16, 4, 2), (32, 4, 2), (64, 4, 2), (64, 8, 2), (128, 8, 2), (128, 8, 3), (32, 2, 2))  # (BV, warps, stages)


def bench(fn) -> float:
    fn()  # compile outside the capture
    return do_bench_cudagraph(fn) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, nargs="*", default=[4, 8, 16, 32], help="value heads (q/k heads: half)")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), help="SEQSxTOKENS")
    opts = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}: us per launch (do_bench_cudagraph)")
    print("heads shape    | wy " + " ".join(f"w{w}s{s}" for w, s in WY) + " | scan "
          + " ".join(f"v{b}w{w}s{s}" for b, w, s in SCAN))
    for hv in opts.heads:
        name = pool_prefill_name(hv // 2, hv)
        for shape in opts.shapes:
            n, t = (int(x) for x in shape.split("x"))
            w = {"uuid": f"sweep-{shape}", "axes": {"total_seq_len": t, "num_seqs": n, "num_slots": n + 1}, "inputs": {}}
            q, k, v, g, beta, pool, idx, init, cu, out, _scale = materialize(name, w, device="cuda")
            scratch_a = torch.empty(t, hv, 64, dtype=torch.float32, device="cuda")
            scratch_t = torch.empty(t, hv, 64, dtype=torch.bfloat16, device="cuda")
            ws, us, qs, ks = (torch.empty(t, hv, 128, dtype=torch.bfloat16, device="cuda") for _ in range(4))
            ge = torch.empty(t, hv, dtype=torch.float32, device="cuda")
            cells = []
            for warps, stages in WY:
                def wy(warps=warps, stages=stages):
                    C._wy_kernel[(triton.cdiv(t, C.CHUNK), hv)](
                        q, k, v, g, beta, g, g, cu, scratch_a, scratch_t, ws, us, qs, ks, ge, out, 128 ** -0.5, t, n,
                        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0),
                        beta.stride(0), hv, q.shape[1], True, False, C.CU_BLOCK, False, C.TRI_PRECISION,
                        num_warps=warps, num_stages=stages)
                cells.append(f"{bench(wy):7.1f}")
            cells.append("|")
            s = pool.stride()
            for bv, warps, stages in SCAN:
                def scan(bv=bv, warps=warps, stages=stages):
                    C._scan_kernel[(n * hv * (128 // bv),)](
                        ws, us, qs, ks, ge, pool, idx, init, cu, out, t, n, pool.shape[0], s[0], s[1], s[2],
                        hv, bv, True, True, C.CU_BLOCK, False, num_warps=warps, num_stages=stages)
                cells.append(f"{bench(scan):7.1f}")
            print(f"{hv:>5} {shape:>8} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
