"""kernels/triton/launch.py on the GPU: after the first call of a specialisation, `launch` goes
straight to the compiled kernel's launcher; a pointer that loses its 16-byte alignment, an int that
becomes 1 or stops dividing by 16, another constexpr or dtype each get their own compiled kernel
(a wrongly reused one would read misaligned vectors or the wrong sizes), and launches inside a CUDA
graph capture land on the capturing stream. Skipped without CUDA. Inputs are drawn on the CPU: after
another test's deliberately failed capture, torch's CUDA generator raises in that process."""
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def scale_add(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr, SHIFT: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, (x * alpha + SHIFT).to(y_ptr.dtype.element_ty), mask=offs < n)
    return scale_add


def _check(kernel, x, n, alpha, shift, block=128):
    import triton
    from kdispatch.kernels.triton.launch import launch

    y = torch.full_like(x, float("nan"))
    launch(kernel, (triton.cdiv(n, block),), x, y, n, alpha, block, shift)
    torch.cuda.synchronize()
    want = (x[:n].float() * alpha + shift).to(x.dtype)
    torch.testing.assert_close(y[:n], want, rtol=1e-2, atol=1e-2)
    assert torch.isnan(y[n:].float()).all()


def test_each_specialisation_is_compiled_and_reused():
    from kdispatch.kernels.triton import launch as L

    kernel = _kernel()
    base = torch.randn(4099).cuda()
    before = len(L._COMPILED)
    for _ in range(2):  # the second round reuses every compiled kernel
        _check(kernel, base, 4096, 0.5, 1)
        _check(kernel, base[1:], 4096, 0.5, 1)  # 4-byte offset: not 16-byte aligned
        _check(kernel, base, 1, 2.0, 1)  # n == 1
        _check(kernel, base, 4001, 2.0, 1)  # n not a multiple of 16
        _check(kernel, base, 4096, 0.5, 3)  # another constexpr
        _check(kernel, base.to(torch.bfloat16), 4096, 0.5, 1)  # another dtype
        _check(kernel, base, 4096, 0.5, 1, block=64)
    assert len(L._COMPILED) - before == 7


def test_captured_launches_replay():
    from kdispatch.kernels.triton.launch import launch

    kernel = _kernel()
    x = torch.randn(1000).cuda()
    y = torch.zeros_like(x)
    launch(kernel, (8,), x, y, 1000, 2.0, 128, 0)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(kernel, (8,), x, y, 1000, 2.0, 128, 0)
    x.copy_(torch.randn(1000))
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, x * 2.0)


def test_wrong_argument_count_is_an_error():
    from kdispatch.kernels.triton.launch import launch

    with pytest.raises(TypeError, match="takes 6 arguments"):
        launch(_kernel(), (1,), torch.zeros(4, device="cuda"))
