"""The fused chunked GDN prefill (kernels/triton/gdn/prefill_fused.py) at every launch configuration of
GRID, beside the two-kernel chunked prefill, the token-by-token CUDA recurrence and, where FlashInfer
and SGLang import, the definition's baseline (SGLang's FlashInfer path with its gather and scatter),
over head counts and pool-convention shapes (SEQSxTOKENS, lengths as the tuner materialises them).
Every fused configuration is first checked against the recurrence on each head count's first shape
(relative error of the output and of the updated states; NaN fails), the default one on every shape.
Timings are triton.testing.do_bench_cudagraph (graph replays, L2-warm inputs): a profile for choosing
configurations, not the tuner's measurement.

    python benchmarks/gdn_fused_grid.py [--heads 4 8 16 32] [--shapes 4x719 16x1024 ...]
"""
from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench_cudagraph

from kdispatch import registry
from kdispatch.definitions.gdn.names import pool_prefill_name
from kdispatch.kernels.triton.gdn import prefill_fused as F
from kdispatch.workloads import materialize

SHAPES = ("4x719", "1x128", "4x512", "16x1024", "64x4096", "256x32768", "64x512", "16x2048", "1x2048", "1x8192")
# (C, BV, warps): the variant's configurations (LAUNCH_CONFIGS) and the alternatives measured beside them
GRID = ((16, 32, 4), (16, 64, 4), (16, 64, 8), (16, 128, 8), (32, 64, 4), (32, 128, 8))
PEERS = ("triton_prefill_chunked.v64", "cuda_prefill_pool_rows.k2c8")


def bench(fn) -> float:
    fn()  # compile outside the capture
    return do_bench_cudagraph(fn) * 1e3


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, nargs="*", default=[4, 8, 16, 32], help="value heads (q/k heads: half)")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), help="SEQSxTOKENS")
    opts = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}: us per call (do_bench_cudagraph)", flush=True)
    for hv in opts.heads:
        name = pool_prefill_name(hv // 2, hv)
        base = registry.baseline(name, "sm90")
        peers = {p: registry.get(name, p) for p in PEERS}
        if base.name != registry.REFERENCE and base.why_not("sm90") is None:
            peers[base.name] = base
        print(f"\n{name}\nshape     | fused " + " ".join(f"c{c}v{bv}w{w}" for c, bv, w in GRID) + " | "
              + " ".join(peers), flush=True)
        for i, shape in enumerate(opts.shapes):
            n, t = (int(x) for x in shape.split("x"))
            w = {"uuid": f"grid-{shape}", "axes": {"total_seq_len": t, "num_seqs": n, "num_slots": n + 1}, "inputs": {}}
            q, k, v, g, beta, pool, idx, init, cu, out, scale = materialize(name, w, device="cuda")
            pool0 = pool.clone()
            want_out, want_pool = torch.empty_like(out), pool0.clone()
            registry.get(name, "cuda_prefill_pool_rows.k2c8").fn(q, k, v, g, beta, want_pool, idx, init, cu, want_out,
                                                                 scale)
            for cfg in GRID if i == 0 else (F.config(n, hv),):
                mine = pool0.clone()
                out.fill_(float("nan"))
                F.gdn_prefill_pool_fused(q, k, v, g, beta, mine, idx, init, cu, out, scale, cfg=cfg)
                eo, es = rel(out, want_out), rel(mine, want_pool)
                flag = "" if eo < 2e-2 and es < 2e-2 else "  FAILS"
                print(f"  check {shape} {cfg}: output {eo:.2e}, states {es:.2e}{flag}", flush=True)
            cells = [bench(lambda cfg=cfg: F.gdn_prefill_pool_fused(q, k, v, g, beta, pool, idx, init, cu, out, scale,
                                                                     cfg=cfg)) for cfg in GRID]
            cells.append(None)
            cells += [bench(lambda p=p: p.fn(q, k, v, g, beta, pool, idx, init, cu, out, scale)) for p in peers.values()]
            print(f"{shape:>9} | " + " ".join("|" if x is None else f"{x:8.1f}" for x in cells), flush=True)


if __name__ == "__main__":
    main()
