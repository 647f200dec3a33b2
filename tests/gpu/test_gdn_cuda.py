"""GPU tests of the CUDA GDN variants (kernels/cuda/gdn/, compiled through kdispatch.nvrtc).

Compared with kdispatch's references (or, if those are missing, the official FlashInfer-Bench
reference code under ../shared/fib) on fresh random inputs at several shapes and every compiled
kernel configuration: output (bf16 tolerance), new state (fp32 tolerance), the state written in
place into the caller's tensor and returned, no NaN/Inf, CUDA-graph capture.  Skipped without CUDA
or cuda.core/NVRTC.

Also a benchmark (not run by pytest):  python tests/gpu/test_gdn_cuda.py [--quick]
prints CUDA-graph replay times (decode with rotated states, as in ../shared/fib/anchors-h100.md),
eager per-call times, the host cost of one launch, and register/spill counts.
"""
from __future__ import annotations

import math
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from kdispatch import nvrtc

_why = None if torch.cuda.is_available() else "no CUDA device"
_why = _why or nvrtc.available()
pytestmark = pytest.mark.skipif(_why is not None, reason=f"needs CUDA and cuda.core/NVRTC: {_why}")

if _why is None:
    from kdispatch.kernels.cuda.gdn import decode_warp_rows as D
    from kdispatch.kernels.cuda.gdn import prefill_thread_rows as P

DEV = "cuda"
HQK, HV, DIM = 4, 8, 128
# (rows per warp, evict-first state accesses) compiled in decode_warp_rows.cu
DECODE_CONFIGS = [(r, cs) for cs in (False, True) for r in (1, 2, 4, 8)]
# (KSPLIT, ROWS, CHUNK) compiled in prefill_thread_rows.cu
PREFILL_CONFIGS = [] if _why else [(ks, r, c) for c, layouts in P.CHUNKS.items() for ks, r in layouts]


# ------------------------------------------------------------------------------------------ references
def _reference(kind):
    if kind == "decode":
        from kdispatch.references.gdn_decode import run
    else:
        from kdispatch.references.gdn_prefill import run
    return run


# ------------------------------------------------------------------------------------------ inputs
def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _unit(*shape, gen):
    return F.normalize(torch.randn(*shape, generator=gen), dim=-1).to(torch.bfloat16).to(DEV)


def _common(gen):
    A_log = (torch.randn(HV, generator=gen) * 0.5).to(DEV)
    dt_bias = (torch.randn(HV, generator=gen) * 0.5).to(DEV)
    return A_log, dt_bias


def decode_inputs(B, seed=0):
    g = _gen(seed)
    q, k = _unit(B, 1, HQK, DIM, gen=g), _unit(B, 1, HQK, DIM, gen=g)
    v = torch.randn(B, 1, HV, DIM, generator=g).to(torch.bfloat16).to(DEV)
    state = (torch.randn(B, HV, DIM, DIM, generator=g) * 0.1).to(DEV)
    A_log, dt_bias = _common(g)
    a = (torch.randn(B, 1, HV, generator=g) * 2).to(torch.bfloat16).to(DEV)
    b = (torch.randn(B, 1, HV, generator=g) * 2).to(torch.bfloat16).to(DEV)
    return q, k, v, state, A_log, a, dt_bias, b, 1.0 / math.sqrt(DIM)


def prefill_inputs(lengths, seed=0):
    g = _gen(seed)
    T, N = sum(lengths), len(lengths)
    q, k = _unit(T, HQK, DIM, gen=g), _unit(T, HQK, DIM, gen=g)
    v = torch.randn(T, HV, DIM, generator=g).to(torch.bfloat16).to(DEV)
    state = (torch.randn(N, HV, DIM, DIM, generator=g) * 0.1).to(DEV)
    A_log, dt_bias = _common(g)
    a = (torch.randn(T, HV, generator=g) * 2).to(torch.bfloat16).to(DEV)
    b = (torch.randn(T, HV, generator=g) * 2).to(torch.bfloat16).to(DEV)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int64, device=DEV)
    return q, k, v, state, A_log, a, dt_bias, b, cu, 1.0 / math.sqrt(DIM)


def _check(out, st, ref_out, ref_state, state_arg):
    assert st is state_arg, "the variant must return the caller's state tensor (updated in place)"
    assert torch.isfinite(out.float()).all() and torch.isfinite(st).all()
    torch.testing.assert_close(st, ref_state.float(), atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=1e-2, rtol=1e-2)


# ------------------------------------------------------------------------------------------ decode
@pytest.mark.parametrize("B", [1, 2, 3, 8, 16, 33, 64, 256])
def test_decode_matches_reference(B):
    args = decode_inputs(B, seed=B)
    ref_out, ref_state = _reference("decode")(*[x.clone() if torch.is_tensor(x) else x for x in args])
    state = args[3]
    out, st = D.gdn_decode_warp_rows(*args)
    assert out.shape == (B, 1, HV, DIM) and out.dtype == torch.bfloat16
    _check(out, st, ref_out, ref_state, state)


@pytest.mark.parametrize("cfg", DECODE_CONFIGS, ids=lambda c: f"r{c[0]}{'_cs' if c[1] else ''}")
@pytest.mark.parametrize("B", [1, 5, 32])
def test_decode_every_config(B, cfg):
    args = decode_inputs(B, seed=100 + B)
    ref_out, ref_state = _reference("decode")(*[x.clone() if torch.is_tensor(x) else x for x in args])
    rows, cs = cfg
    out, st = D.gdn_decode_warp_rows(*args, rows=rows, cs=cs)
    _check(out, st, ref_out, ref_state, args[3])


def test_decode_default_scale_and_strided_inputs():
    args = list(decode_inputs(4, seed=7))
    ref_out, ref_state = _reference("decode")(*[x.clone() if torch.is_tensor(x) else x for x in args[:-1]], 0.0)
    # a non-contiguous state view (still updated in place) and q, k sliced out of a wider buffer
    big = torch.zeros(4, HV, DIM, 2 * DIM, device=DEV)
    big[..., :DIM] = args[3]
    args[3] = big[..., :DIM]
    qk = torch.cat([args[0], args[1]], dim=2)
    args[0], args[1] = qk[:, :, :HQK], qk[:, :, HQK:]
    out, st = D.gdn_decode_warp_rows(*args[:-1], 0.0)
    _check(out, st, ref_out, ref_state, args[3])
    assert torch.equal(big[..., :DIM], st)


@pytest.mark.parametrize("pad", [0, 4, 2], ids=["packed", "padded", "misaligned"])
@pytest.mark.parametrize("B", [1, 33])
def test_decode_reads_packed_views_as_contiguous(B, pad):
    """q/k/v split out of one mixed_qkv row and a/b out of one ba row (pad: extra elements per row;
    2 breaks the 8-byte alignment of q/k rows, where the wrapper copies them): bitwise the results
    of contiguous inputs."""
    args = list(decode_inputs(B, seed=11 + B))
    want_state = args[3].clone()
    want_out, _ = D.gdn_decode_warp_rows(*args[:3], want_state, *args[4:])
    q, k, v, state, A_log, a, dt_bias, b, scale = args
    mixed = torch.cat([q.reshape(B, -1), k.reshape(B, -1), v.reshape(B, -1),
                       torch.zeros(B, pad, dtype=q.dtype, device=DEV)], dim=1)
    ba = torch.cat([b.reshape(B, -1), a.reshape(B, -1)], dim=1)
    views = (mixed[:, :512].view(B, 1, HQK, DIM), mixed[:, 512:1024].view(B, 1, HQK, DIM),
             mixed[:, 1024:2048].view(B, 1, HV, DIM), ba[:, HV:].view(B, 1, HV), ba[:, :HV].view(B, 1, HV))
    out, st = D.gdn_decode_warp_rows(views[0], views[1], views[2], state, A_log, views[3], dt_bias, views[4], scale)
    assert torch.equal(out, want_out) and torch.equal(st, want_state)


def test_decode_cuda_graph():
    args = decode_inputs(8, seed=3)
    state0 = args[3].clone()
    D.gdn_decode_warp_rows(*args)  # compile + warm up outside the capture
    args[3].copy_(state0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, _ = D.gdn_decode_warp_rows(*args)
    fresh = decode_inputs(8, seed=4)
    for dst, src in zip(args, fresh):
        if torch.is_tensor(dst):
            dst.copy_(src)
    ref_out, ref_state = _reference("decode")(*[x.clone() if torch.is_tensor(x) else x for x in args])
    g.replay()
    torch.cuda.synchronize()
    _check(out, args[3], ref_out, ref_state, args[3])


# ------------------------------------------------------------------------------------------ prefill
PREFILL_CASES = [[1], [6], [30], [134], [7, 0, 20], [64, 64], [3] * 16, [1, 17, 2, 40, 5] * 4, [5] * 40,
                 [300], [8, 9, 1, 250]]


@pytest.mark.parametrize("lengths", PREFILL_CASES, ids=[f"T{sum(x)}_N{len(x)}" for x in PREFILL_CASES])
def test_prefill_matches_reference(lengths):
    args = prefill_inputs(lengths, seed=len(lengths) + sum(lengths))
    ref_out, ref_state = _reference("prefill")(*[x.clone() if torch.is_tensor(x) else x for x in args])
    out, st = P.gdn_prefill_thread_rows(*args)
    assert out.shape == (sum(lengths), HV, DIM) and out.dtype == torch.bfloat16
    _check(out, st, ref_out, ref_state, args[3])


@pytest.mark.parametrize("cfg", PREFILL_CONFIGS, ids=lambda c: "k{}_r{}_c{}".format(*c))
def test_prefill_every_config(cfg):
    args = prefill_inputs([9, 0, 33, 2, 40], seed=11)
    ref_out, ref_state = _reference("prefill")(*[x.clone() if torch.is_tensor(x) else x for x in args])
    out, st = P.gdn_prefill_thread_rows(*args, cfg=cfg)
    _check(out, st, ref_out, ref_state, args[3])


@pytest.mark.parametrize("cfg", PREFILL_CONFIGS, ids=lambda c: "k{}_r{}_c{}".format(*c))
def test_prefill_extreme_gates(cfg):
    """Gates from ~1 down to underflow (exp(-1600): large A_log and a), full and partial chunks:
    finite and equal to the reference in every kernel."""
    args = list(prefill_inputs([37, 19], seed=13))
    args[4] = torch.tensor([4.0, 3.0, 2.0, 0.0, -2.0, -4.0, -8.0, 1.0], device=DEV)  # A_log
    args[5] = (torch.randn(56, HV) * 8).to(torch.bfloat16).to(DEV)  # a: softplus from ~0 to ~30
    ref_out, ref_state = _reference("prefill")(*[x.clone() if torch.is_tensor(x) else x for x in args])
    out, st = P.gdn_prefill_thread_rows(*args, cfg=cfg)
    _check(out, st, ref_out, ref_state, args[3])


def test_prefill_cuda_graph():
    args = prefill_inputs([12, 5], seed=5)
    state0 = args[3].clone()
    P.gdn_prefill_thread_rows(*args)
    args[3].copy_(state0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, _ = P.gdn_prefill_thread_rows(*args)
    fresh = prefill_inputs([12, 5], seed=6)
    for dst, src in zip(args, fresh):
        if torch.is_tensor(dst):
            dst.copy_(src)
    ref_out, ref_state = _reference("prefill")(*[x.clone() if torch.is_tensor(x) else x for x in args])
    g.replay()
    torch.cuda.synchronize()
    _check(out, args[3], ref_out, ref_state, args[3])


def test_registered_and_dispatchable():
    from kdispatch import registry
    from kdispatch.arch import local_arch

    for d, n in (("gdn_decode", "cuda_decode_warp_rows.r1cs"), ("gdn_prefill", "cuda_prefill_thread_rows.k8c16")):
        v = registry.get(d, n)
        if local_arch() in v.archs:
            assert v.why_not(local_arch()) is None


def test_no_spills_on_this_nvrtc():
    """No local memory (spills, stack) in any kernel, read off the loaded kernels; registers printed."""
    kernels = [D.kernel(*c) for c in DECODE_CONFIGS] + [P.kernel(*c) for c in PREFILL_CONFIGS]
    for kern in kernels:
        res = kern.resources()
        print(kern.name, res)
        assert res["local_bytes"] == 0, (kern.name, res)
    assert P.kernel(1, 128, 8).resources()["registers"] >= 128  # one thread per row: 128 state values


# ------------------------------------------------------------------------------------------ benchmark
def _graph_time(fn, reps=20, iters=10):
    """Median µs per call over CUDA-graph replays of `reps` calls (fn(i) issues call i)."""
    fn(0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1000 / reps)
    return sorted(ts)[len(ts) // 2]


def _eager_time(fn, n=200):
    """µs per call, host + device, synchronised once per call."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def _host_time(fn, n=2000):
    """µs of host time per call (calls queued back to back, one sync at the end)."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t
    torch.cuda.synchronize()
    return dt / n * 1e6


def bench(quick=False):
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, cuda.core {nvrtc.core_version()}, "
          f"NVRTC {nvrtc.nvrtc_version()}, arch {nvrtc.device_arch()}")
    t = time.perf_counter()
    kd = D.kernel(1)
    print(f"decode load (compile or disk cache: {'hit' if kd.compiled.cached else 'compile'}) "
          f"{time.perf_counter() - t:.2f} s, compile {kd.compiled.seconds:.2f} s")
    t = time.perf_counter()
    kp = P.kernel(1, 128)
    print(f"prefill load ({'hit' if kp.compiled.cached else 'compile'}) {time.perf_counter() - t:.2f} s, "
          f"compile {kp.compiled.seconds:.2f} s")
    for k in [D.kernel(*c) for c in DECODE_CONFIGS] + [P.kernel(*c) for c in P.CONFIGS]:
        print(f"  {k.name}: {k.resources()}")

    # host cost of one launch: packed driver launch vs cuda.core.launch (B = 1 decode kernel)
    args = decode_inputs(1)
    out = torch.empty(1, 1, HV, DIM, dtype=torch.bfloat16, device=DEV)
    ptrs = [x.data_ptr() for x in args[:8]] + [out.data_ptr()]
    s = nvrtc.current_stream()
    print(f"\nhost µs per launch: Kernel.launch(ints) {_host_time(lambda: kd.launch(256, 128, *ptrs, 0.1, stream=s)):.2f}"
          f", Kernel.launch(tensors, current stream) "
          f"{_host_time(lambda: kd.launch(256, 128, *args[:8], out, 0.1)):.2f}"
          f", variant call {_host_time(lambda: D.gdn_decode_warp_rows(*args)):.2f}"
          f", torch.empty+add_ {_host_time(lambda: torch.empty(8, device=DEV).add_(1)):.2f}")
    kp_addr = kd._tls.pack[1]
    from cuda.bindings import driver

    cs = driver.CUstream(s)
    print(f"  raw bindings cuLaunchKernel (prepacked, int stream) "
          f"{_host_time(lambda: kd._launch(kd._fn, 256, 1, 1, 128, 1, 1, 0, s, kp_addr, 0)):.2f}"
          f", (CUstream object) {_host_time(lambda: kd._launch(kd._fn, 256, 1, 1, 128, 1, 1, 0, cs, kp_addr, 0)):.2f}")
    try:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        f = lib.cuLaunchKernel
        f.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        f.restype = ctypes.c_int
        h = int(kd.core.handle)
        print(f"  ctypes cuLaunchKernel (prepacked) {_host_time(lambda: f(h, 256, 1, 1, 128, 1, 1, 0, s, kp_addr, None)):.2f}")
        core = nvrtc._cuda_core()
        cfg = core.LaunchConfig(grid=256, block=128)
        st = core.Stream.from_handle(s)
        import numpy as np

        cargs = [*ptrs, np.float32(0.1)]
        print(f"  cuda.core.launch {_host_time(lambda: core.launch(st, cfg, kd.core, *cargs)):.2f}"
              f", torch.cuda.current_stream().cuda_stream {_host_time(lambda: torch.cuda.current_stream().cuda_stream):.2f}"
              f", nvrtc.current_stream() {_host_time(nvrtc.current_stream):.2f}")
    except Exception as exc:  # noqa: BLE001
        print(f"  launch comparison failed: {type(exc).__name__}: {exc}")

    # decode: graph replay with rotated states (working set > 200 MB), every R
    print("\ndecode µs (graph, rotated states) per rows-per-warp R (cs: evict-first state accesses); default *; "
          "floor = bytes / 3.35 TB/s")
    batches = (1, 4, 16, 64) if quick else (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 256)
    for B in batches:
        base = decode_inputs(B)
        sbytes = B * HV * DIM * DIM * 4
        nrot = max(2, min(64, math.ceil(200e6 / sbytes)))
        states = [base[3].clone() for _ in range(nrot)]
        row = []
        for R, cs in DECODE_CONFIGS:
            us = _graph_time(lambda i, R=R, cs=cs: D.gdn_decode_warp_rows(
                *base[:3], states[i % nrot], *base[4:], rows=R, cs=cs), reps=max(20, nrot))
            star = "*" if (R, cs) == D.config(B) else " "
            row.append(f"{'cs' if cs else ''}R{R}{star} {us:6.2f}")
        eager = _eager_time(lambda: D.gdn_decode_warp_rows(*base))
        floor = 2 * sbytes / 3.35e12 * 1e6
        print(f"  B={B:4d} {'  '.join(row)}   eager {eager:6.1f}   floor {floor:6.2f}")

    print("\nprefill µs (graph, same buffers) per (KSPLIT, ROWS, CHUNK); default marked *")
    cases = [(6, 1), (30, 1), (134, 2), (1024, 16)] if quick else \
        [(6, 1), (30, 1), (134, 1), (134, 2), (64, 4), (256, 4), (256, 8), (512, 16), (1024, 2), (1024, 16),
         (1024, 32), (2048, 64), (8192, 32), (8192, 256)]
    for T, N in cases:
        lengths = [T // N + (1 if i < T % N else 0) for i in range(N)]
        a = prefill_inputs(lengths)
        row = []
        for cfg in PREFILL_CONFIGS:
            us = _graph_time(lambda i, cfg=cfg: P.gdn_prefill_thread_rows(*a, cfg=cfg), reps=5, iters=5)
            row.append("k{}r{}c{}".format(*cfg) + f"{'*' if cfg == P.config(N, T) else ' '} {us:8.1f}")
        eager = _eager_time(lambda: P.gdn_prefill_thread_rows(*a), n=20)
        print(f"  T={T:5d} N={N:3d}  {'  '.join(row)}   eager {eager:7.1f}")


if __name__ == "__main__":
    if _why is not None:
        sys.exit(f"cannot run: {_why}")
    bench(quick="--quick" in sys.argv)
