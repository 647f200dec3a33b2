"""kernels/triton/launches.py on the GPU: a call whose key was seen reuses the kernels compiled by the
first call with that key, launch by launch; another key (an alignment, a constexpr) compiles its
own; a call that launches other kernels than its key's first call raises; launches inside a CUDA
graph capture land on the capturing stream; a programmatic dependent launch waits for the kernel
before it. Skipped without CUDA."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def scale(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * alpha, mask=offs < n)

    @triton.jit
    def shift(y_ptr, n, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(y_ptr + offs, mask=offs < n) + SHIFT, mask=offs < n)
    return scale, shift


def _call(kernels, x, n, alpha, shift_by, block=128, site="test scale-shift"):
    """y = x * alpha + shift_by over n elements, in two launches keyed once (a site per kernel pair)."""
    from kdispatch.kernels.triton.launches import Launches, call_key

    scale, shift = kernels
    y = torch.full_like(x, float("nan"))
    run = Launches((*call_key(site, x, y), n == 1, n % 16 == 0, shift_by, block))
    grid = (-(-n // block),)
    run(scale, grid, x, y, n, alpha, block)
    run(shift, grid, y, n, shift_by, block)
    torch.cuda.synchronize()
    torch.testing.assert_close(y[:n], x[:n] * alpha + shift_by)
    assert torch.isnan(y[n:]).all()
    return run


def test_keys_reuse_and_recompile():
    from kdispatch.kernels.triton import launches as L

    kernels = _kernels()
    base = torch.randn(4099).cuda()
    before = len(L._CALLS)
    for _ in range(2):  # the second round reuses every key's kernels (the runs differ only in data)
        _call(kernels, base, 4096, 0.5, 1)
        _call(kernels, base, 4000, 1.5, 1)  # same key: n's class and the constexprs are the same
        _call(kernels, base[1:], 4096, 0.5, 1)  # 4-byte offset: not 16-byte aligned
        _call(kernels, base, 4001, 2.0, 1)  # n not a multiple of 16
        _call(kernels, base, 4096, 0.5, 3)  # another constexpr
    assert len(L._CALLS) - before == 4
    assert all(len(done) == 2 for key, done in L._CALLS.items() if key[0] == "test scale-shift")


def test_a_call_that_launches_otherwise_raises():
    from kdispatch.kernels.triton.launches import Launches, call_key

    scale, shift = _kernels()
    x = torch.randn(256).cuda()
    key = call_key("test mismatch", x)
    Launches(key)(scale, (2,), x, x, 256, 1.0, 128)
    with pytest.raises(RuntimeError, match="the key misses"):
        Launches(key)(shift, (2,), x, 256, 1, 128)


def test_captured_launches_replay():
    kernels = _kernels()
    x = torch.randn(1000).cuda()
    _call(kernels, x, 1000, 2.0, 1, site="test capture")  # compiled outside the capture
    from kdispatch.kernels.triton.launches import Launches, call_key

    scale, shift = kernels
    y = torch.zeros_like(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run = Launches((*call_key("test capture", x, y), False, False, 1, 128))
        run(scale, (8,), x, y, 1000, 2.0, 128)
        run(shift, (8,), y, 1000, 1, 128)
    y.fill_(float("nan"))
    x.copy_(torch.randn(1000).cuda())
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x * 2.0 + 1)


def test_programmatic_dependent_launch_waits_for_the_kernel_before():
    """A kernel launched with launch_pdl starts early and waits (gdc_wait) for the one before: a slow
    producer's results are there, on the first (JIT) call and on calls that reuse its kernels."""
    import triton
    import triton.language as tl

    from kdispatch.kernels.triton.launches import Launches, call_key

    @triton.jit
    def produce(x_ptr, n, ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
        tl.extra.cuda.gdc_launch_dependents()  # the consumer may start at once
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n)
        for _ in range(ROUNDS):  # slow enough that a consumer reading early would see the old values
            v = v * 1.0000001 + 0.0
        tl.store(x_ptr + offs, v + 1.0, mask=offs < n)

    @triton.jit
    def consume(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        tl.extra.cuda.gdc_wait()
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)

    n, block = 1 << 20, 1024
    for _ in range(3):
        x = torch.zeros(n, device="cuda")
        y = torch.full_like(x, float("nan"))
        run = Launches((*call_key("test pdl", x, y), n, block))
        run(produce, (n // block,), x, n, 2000, block)
        run(consume, (n // block,), x, y, n, block, launch_pdl=True)
        torch.cuda.synchronize()
        torch.testing.assert_close(y, torch.full_like(y, 2.0), atol=1e-2, rtol=0)
