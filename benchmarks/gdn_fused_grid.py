"""The fused chunked GDN prefill (kernels/triton/gdn/prefill_fused.py), the staged one
(prefill_staged.py) and the staged one with the CUDA walk (kernels/cuda/gdn/prefill_walk.py, "mma")
at every launch configuration of GRID, beside the two-kernel chunked prefill, the
token-by-token CUDA recurrence and, where FlashInfer and SGLang import, the definition's baseline
(SGLang's FlashInfer path with its gather and scatter), over head counts and pool-convention shapes
(SEQSxTOKENS, lengths as the tuner materialises them). Every configuration of both is first checked
against the recurrence on each head count's first shape (relative error of the output and of the
updated states; NaN fails), each kernel's default one on every shape.
Timings are graph replays of one call on each of SETS input sets in turn (their median over 15
replays, per call), so that no shape runs from a warm L2: a profile for choosing configurations, not
the tuner's measurement.

    python benchmarks/gdn_fused_grid.py [--heads 4 8 16 32] [--shapes 4x719 16x1024 ...]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from kdispatch import registry
from kdispatch.definitions.gdn.names import pool_prefill_name
from kdispatch.kernels.cuda.gdn import prefill_walk as W
from kdispatch.kernels.triton.gdn import prefill_fused as F
from kdispatch.kernels.triton.gdn import prefill_staged as S
from kdispatch.workloads import materialize

SHAPES = ("4x719", "1x128", "4x512", "16x1024", "64x4096", "256x32768", "64x512", "16x2048", "1x2048", "1x8192")
# (kernel, C, BV, warps): the variants' registered configurations (LAUNCH_CONFIGS; 128 rows at 8 warps
# and 32-token chunks never won, gdn-fused-grid-H200.txt of 2026-11-30 in git history); for "mma" (the
# staged kernel with the CUDA walk, kernels/cuda/gdn/prefill_walk.py) (kernel, pipeline stages, rows a
# block, warps)
GRID = (("fused", 16, 32, 4), ("fused", 16, 64, 4), ("staged", 16, 32, 4), ("staged", 16, 64, 4)) + tuple(
        ("mma", n, 16 * w, w) for w, n in W.KERNELS)


def _mma(*args, cfg):
    return W.gdn_prefill_pool_walk(*args, cfg=(cfg[2], cfg[0]))


def _label(kn, c, bv, w) -> str:
    return f"mma.r{bv}s{c}" if kn == "mma" else f"{kn[:6]}.c{c}v{bv}w{w}"


CALLS = {"fused": (F.gdn_prefill_pool_fused, F.config), "staged": (S.gdn_prefill_pool_staged, S.config),
         "mma": (_mma, lambda n, hv: (W.config(n, hv)[1], 16 * W.config(n, hv)[0], W.config(n, hv)[0]))}
PEERS = ("triton_prefill_chunked.v64", "cuda_prefill_pool_rows.k2c8")


SETS = 8


def bench(fn, sets) -> float:
    """us per call of fn(*inputs), graph replays over the input sets."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for a in sets:  # compile outside the capture
            fn(*a)
        with torch.cuda.graph(graph, stream=stream):
            for a in sets:
                fn(*a)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(15):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(sets))
    return statistics.median(times)


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, nargs="*", default=[4, 8, 16, 32], help="value heads (q/k heads: half)")
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), help="SEQSxTOKENS")
    opts = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}: us per call (graph replays over {SETS} input sets)", flush=True)
    for hv in opts.heads:
        name = pool_prefill_name(hv // 2, hv)
        base = registry.baseline(name, "sm90")
        peers = {p: registry.get(name, p) for p in PEERS}
        if base.name != registry.REFERENCE and base.why_not("sm90") is None:
            peers[base.name] = base
        print(f"\n{name}\nshape     | " + " ".join(_label(*cell) for cell in GRID) + " | "
              + " ".join(peers), flush=True)
        for i, shape in enumerate(opts.shapes):
            n, t = (int(x) for x in shape.split("x"))
            axes = {"total_seq_len": t, "num_seqs": n, "num_slots": n + 1}
            sets = [materialize(name, {"uuid": f"grid-{shape}-{j}", "axes": axes, "inputs": {}}, device="cuda")
                    for j in range(SETS)]
            q, k, v, g, beta, pool, idx, init, cu, out, scale = sets[0]
            pool0 = pool.clone()
            want_out, want_pool = torch.empty_like(out), pool0.clone()
            registry.get(name, "cuda_prefill_pool_rows.k2c8").fn(q, k, v, g, beta, want_pool, idx, init, cu, want_out,
                                                                 scale)
            checks = [(kn, c, bv, w) for kn, c, bv, w in GRID] if i == 0 else \
                [(kn, *CALLS[kn][1](n, hv)) for kn in CALLS]
            for kn, *cfg in checks:
                mine = pool0.clone()
                out.fill_(float("nan"))
                CALLS[kn][0](q, k, v, g, beta, mine, idx, init, cu, out, scale, cfg=tuple(cfg))
                eo, es = rel(out, want_out), rel(mine, want_pool)
                flag = "" if eo < 2e-2 and es < 2e-2 else "  FAILS"
                print(f"  check {shape} {kn} {tuple(cfg)}: output {eo:.2e}, states {es:.2e}{flag}", flush=True)
            cells = [bench(lambda *a, kn=kn, cfg=(c, bv, w): CALLS[kn][0](*a, cfg=cfg), sets) for kn, c, bv, w in GRID]
            cells.append(None)
            cells += [bench(p.fn, sets) for p in peers.values()]
            print(f"{shape:>9} | " + " ".join("|" if x is None else f"{x:8.1f}" for x in cells), flush=True)


if __name__ == "__main__":
    main()
