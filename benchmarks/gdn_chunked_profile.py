"""Where the chunked GDN prefill's time goes (kernels/triton/gdn/prefill_chunked.py): its WY kernel and
its scan timed apart, beside the whole call, each scan configuration, and the token-by-token CUDA
recurrence (`cuda_prefill_pool_rows`) on the same inputs, for the pool convention at one head count.
Each timing is triton.testing.do_bench (L2 flushed before every call, eager launches: a profile, not
the tuner's graph-replay measurement).

    python benchmarks/gdn_chunked_profile.py [--heads 8] [--shapes 1x1 4x719 ...]
"""
from __future__ import annotations

import argparse

import torch
import triton
from triton.testing import do_bench

from kdispatch import registry
from kdispatch.definitions.gdn.spec import pool_prefill_name
from kdispatch.kernels.triton.gdn import prefill_chunked as C
from kdispatch.workloads import materialize

SHAPES = ("1x1", "1x64", "1x1024", "1x8192", "4x719", "10x794", "22x2141", "64x4096", "103x114")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=8, help="value heads (q/k heads: half)")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), help="SEQSxTOKENS")
    ap.add_argument("--sweep", action="store_true", help="also the WY kernel at 1, 2, 8 warps and other scan layouts")
    opts = ap.parse_args()
    hv = opts.heads
    name = pool_prefill_name(hv // 2, hv)
    print(f"{torch.cuda.get_device_name()}  {name}  (us, do_bench, L2 flushed)")
    print(f"{'shape':>10}{'wy':>9}{'scan v32':>10}{'scan v64':>10}{'call v32':>10}{'call v64':>10}{'recur k4c8':>12}")
    for shape in opts.shapes:
        n, t = (int(x) for x in shape.split("x"))
        w = {"uuid": f"profile-{shape}", "axes": {"total_seq_len": t, "num_seqs": n, "num_slots": n + 1}, "inputs": {}}
        q, k, v, g, beta, pool, idx, init, cu, out, scale = materialize(name, w, device="cuda")
        ws = torch.empty(t, hv, 128, dtype=torch.bfloat16, device="cuda")
        us = torch.empty_like(ws)
        ps = torch.empty(t, hv, 64, dtype=torch.bfloat16, device="cuda")
        sc = torch.empty(t, hv, 2, dtype=torch.float32, device="cuda")
        gc = torch.empty(t, hv, dtype=torch.float32, device="cuda")
        compiled = {}

        def wy(warps=4):
            def go():
                compiled["wy"] = C._wy_kernel[(triton.cdiv(t, C.CHUNK), hv)](
                    q, k, v, g, beta, g, g, cu, ws, us, ps, sc, gc, t, n, q.stride(0), q.stride(1), k.stride(0),
                    k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0), hv, hv // 2, True, False,
                    C.CU_BLOCK, False, num_warps=warps, num_stages=1)
            return go

        def scan(bv, warps, stages=2):
            s = pool.stride()

            def go():
                compiled[f"scan{bv}"] = C._scan_kernel[(n * hv * (128 // bv),)](
                    q, k, ws, us, ps, sc, gc, pool, idx, init, cu, out, scale or 128 ** -0.5, t, n, pool.shape[0],
                    q.stride(0), q.stride(1), k.stride(0), k.stride(1), s[0], s[1], s[2],
                    hv, hv // 2, bv, True, True, C.CU_BLOCK, False, num_warps=warps, num_stages=stages)
            return go

        call = lambda bv: lambda: C.gdn_prefill_pool_chunked(q, k, v, g, beta, pool, idx, init, cu, out, scale,  # noqa: E731
                                                            cfg=(bv, 4))
        rec = registry.get(name, "cuda_prefill_pool_rows.k4c8").fn
        times = [do_bench(f) * 1e3 for f in (wy(), scan(32, 4), scan(64, 4), call(32), call(64),
                                              lambda: rec(q, k, v, g, beta, pool, idx, init, cu, out, scale))]
        print(f"{shape:>10}" + "".join(f"{x:>10.1f}" for x in times), flush=True)
        if shape == opts.shapes[0]:
            print(" " * 10 + "  ".join(f"{name}: {kern.n_regs} regs, {kern.n_spills} spills"
                                       for name, kern in compiled.items()), flush=True)
        if opts.sweep:
            extra = {f"wy w{w}": wy(w) for w in (1, 2, 8)}
            extra.update({"scan v32 s1": scan(32, 4, 1), "scan v32 w8": scan(32, 8), "scan v16 w4": scan(16, 4)})
            print(" " * 10 + "  ".join(f"{k} {do_bench(f) * 1e3:.1f}" for k, f in extra.items()), flush=True)


if __name__ == "__main__":
    main()
