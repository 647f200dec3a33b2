"""Where the chunked GDN prefill's time goes (kernels/triton/gdn/prefill_chunked.py): its WY kernel and
its scan timed apart, beside the whole call, each scan configuration, and the token-by-token CUDA
recurrence (`cuda_prefill_pool_rows`) on the same inputs, for the pool convention at one head count.
Each timing is triton.testing.do_bench_cudagraph (graph replays, inputs L2-warm: a profile, not the
tuner's measurement). Each shape is first checked against the recurrence (relative error of the
output and of the updated states).

    python benchmarks/gdn_chunked_profile.py [--heads 8] [--shapes 1x1 4x719 ...]
    python benchmarks/gdn_chunked_profile.py --grid [--heads 4 8 16 32] [--shapes 1x256 ...]

--grid: each kernel alone at every launch configuration of GRID_WY / GRID_SCAN (not only the
variant's), over head counts and shapes, one input set (L2-warm), no checks: for choosing
configurations. The scan at num_stages=1 faults (Triton 3.6; see the kernel's docstring).
"""
from __future__ import annotations

import argparse

import torch
import triton
from triton.testing import do_bench_cudagraph

from kdispatch import registry
from kdispatch.definitions.gdn.names import pool_prefill_name
from kdispatch.kernels.triton.gdn import prefill_chunked as C
from kdispatch.workloads import materialize

SHAPES = ("1x1", "1x64", "1x1024", "1x8192", "4x719", "10x794", "22x2141", "64x4096", "103x114")
GRID_SHAPES = ("1x256", "4x512", "64x512", "16x2048", "64x8192", "1x8192")
GRID_WY = ((8, 1), (4, 1), (4, 2), (2, 1))  # (warps, stages)
GRID_SCAN = ((16, 4, 2), (32, 4, 2), (64, 4, 2), (64, 8, 2), (128, 8, 2), (128, 8, 3), (32, 2, 2))  # (BV, warps, stages)


def bench(fn) -> float:
    fn()  # compile outside the capture
    return do_bench_cudagraph(fn) * 1e3


class Launches:
    """One pool-convention shape's inputs (materialised as the tuner does) and the chunked prefill's
    two kernels launched on them alone, with the arguments `_chunked` gives them, at any launch
    configuration; `compiled` holds the last compiled kernel of each."""

    def __init__(self, hv: int, shape: str):
        self.hv = hv
        self.n, self.t = (int(x) for x in shape.split("x"))
        self.name = pool_prefill_name(hv // 2, hv)
        w = {"uuid": f"profile-{shape}", "axes": {"total_seq_len": self.t, "num_seqs": self.n, "num_slots": self.n + 1},
             "inputs": {}}
        self.args = materialize(self.name, w, device="cuda")
        t = self.t
        self.tri = (torch.empty(t, hv, 64, dtype=torch.float32, device="cuda"),
                    torch.empty(t, hv, 64, dtype=torch.bfloat16, device="cuda"))
        self.wuqk = [torch.empty(t, hv, 128, dtype=torch.bfloat16, device="cuda") for _ in range(4)]
        self.g_end = torch.empty(t, hv, dtype=torch.float32, device="cuda")
        self.compiled = {}

    def wy(self, warps=8, stages=1, prec=None):
        q, k, v, g, beta, _pool, _idx, _init, cu, out, _scale = self.args
        t, n, hv = self.t, self.n, self.hv

        def go():
            self.compiled["wy"] = C._wy_kernel[(triton.cdiv(t, C.CHUNK), hv)](
                q, k, v, g, beta, g, g, cu, *self.tri, *self.wuqk, self.g_end, out, 128 ** -0.5, t, n, q.stride(0),
                q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
                hv, q.shape[1], True, False, C.CU_BLOCK, False, prec or C.TRI_PRECISION, num_warps=warps,
                num_stages=stages)
        return go

    def scan(self, bv, warps, stages=2):
        _q, _k, _v, _g, _beta, pool, idx, init, cu, out, _scale = self.args
        s = pool.stride()

        def go():
            self.compiled[f"scan{bv}"] = C._scan_kernel[(self.n * self.hv * (128 // bv),)](
                *self.wuqk, self.g_end, pool, idx, init, cu, out, self.t, self.n, pool.shape[0], s[0], s[1], s[2],
                self.hv, bv, True, True, C.CU_BLOCK, False, num_warps=warps, num_stages=stages)
        return go


def grid(heads, shapes) -> None:
    print(f"{torch.cuda.get_device_name()}: us per launch (do_bench_cudagraph)")
    print("heads shape    | wy " + " ".join(f"w{w}s{s}" for w, s in GRID_WY) + " | scan "
          + " ".join(f"v{b}w{w}s{s}" for b, w, s in GRID_SCAN))
    for hv in heads:
        for shape in shapes:
            L = Launches(hv, shape)
            cells = [f"{bench(L.wy(w, s)):7.1f}" for w, s in GRID_WY] + ["|"]
            cells += [f"{bench(L.scan(*c)):7.1f}" for c in GRID_SCAN]
            print(f"{hv:>5} {shape:>8} " + " ".join(cells), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, nargs="*", default=None, help="value heads (q/k heads: half); default 8, "
                    "--grid 4 8 16 32")
    ap.add_argument("--shapes", nargs="*", default=None, help="SEQSxTOKENS")
    ap.add_argument("--sweep", action="store_true", help="also other warps, precisions and scan layouts (first shape)")
    ap.add_argument("--grid", action="store_true", help="every kernel configuration over head counts and shapes")
    opts = ap.parse_args()
    if opts.grid:
        grid(opts.heads or [4, 8, 16, 32], opts.shapes or list(GRID_SHAPES))
        return
    hv = (opts.heads or [8])[0]
    name = pool_prefill_name(hv // 2, hv)
    print(f"{torch.cuda.get_device_name()}  {name}  (us, do_bench_cudagraph)")
    print(f"{'shape':>10}{'wy':>10}{'scan v16':>10}{'scan v64':>10}{'call v16':>10}{'call v64':>10}"
          f"{'recur k4c8':>12}")
    for shape in opts.shapes or SHAPES:
        L = Launches(hv, shape)
        q, k, v, g, beta, pool, idx, init, cu, out, scale = L.args
        compiled, scan = L.compiled, L.scan

        def wy(warps=8, prec=None):
            return L.wy(warps, 1, prec)

        call = lambda bv: lambda: C.gdn_prefill_pool_chunked(q, k, v, g, beta, pool, idx, init, cu, out, scale,  # noqa: E731
                                                            cfg=(bv, 4))
        rec = registry.get(name, "cuda_prefill_pool_rows.k4c8").fn
        pool0 = pool.clone()
        want_out, want_pool = torch.empty_like(out), pool0.clone()  # the recurrence, gated correct by the tuner
        rec(q, k, v, g, beta, want_pool, idx, init, cu, want_out, scale)
        default_prec = C.TRI_PRECISION
        for bv, prec in ((16, default_prec), (64, default_prec), (16, "tf32x3")):
            C.TRI_PRECISION = prec
            mine = pool0.clone()
            out.fill_(float("nan"))
            C.gdn_prefill_pool_chunked(q, k, v, g, beta, mine, idx, init, cu, out, scale, cfg=(bv, 4))
            err_o = ((out.float() - want_out.float()).norm() / want_out.float().norm()).item()
            err_s = ((mine - want_pool).norm() / want_pool.norm()).item()
            print(f"{shape:>10} check v{bv} {prec}: output rel err {err_o:.2e}, states rel err {err_s:.2e}",
                  flush=True)
        C.TRI_PRECISION = default_prec
        for f in (wy(), scan(16, 4), scan(64, 4)):
            f()
        times = [bench(f) for f in (wy(), scan(16, 4), scan(64, 4), call(16), call(64),
                                              lambda: rec(q, k, v, g, beta, pool, idx, init, cu, out, scale))]
        print(f"{shape:>10}" + "".join(f"{x:>10.1f}" for x in times), flush=True)
        if shape == (opts.shapes or SHAPES)[0]:
            print(" " * 10 + "  ".join(f"{name}: {kern.n_regs} regs, {kern.n_spills} spills"
                                       for name, kern in compiled.items()), flush=True)
        if opts.sweep and shape == (opts.shapes or SHAPES)[0]:
            extra = {"wy tf32x3": wy(8, "tf32x3"), "wy w4": wy(4), "scan v16 s3": scan(16, 4, 3),
                     "scan v16 w8": scan(16, 8), "scan v32": scan(32, 4)}
            for label, f in extra.items():
                print(f"{'':>10}{label}: ", end="", flush=True)
                print(f"{bench(f):.1f}", flush=True)


if __name__ == "__main__":
    main()
