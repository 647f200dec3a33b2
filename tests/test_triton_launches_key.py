"""kernels/triton/launches.py on the CPU: what `call_key` separates, and the bookkeeping of `Launches`
with a stand-in for a JIT kernel and Triton's driver (the GPU test, tests/gpu/test_triton_launches.py,
runs real kernels): the first call with a key makes JIT calls and keeps what they compiled, a later
call sends each launch to the kernel compiled at its position with its own grid and arguments, a
call that launches another kernel at a position raises, and an interpreted kernel is never kept."""
import pytest
import torch
from triton.runtime.jit import JITFunction

from kdispatch.kernels.triton import launches as L


def test_call_key_separates_site_dtype_and_alignment():
    x = torch.zeros(64)
    assert L.call_key("op", x) == L.call_key("op", torch.zeros(32))
    different = [L.call_key("op", x), L.call_key("other", x), L.call_key("op", x[1:]),
                 L.call_key("op", x.double()), L.call_key("op", x, x)]
    assert len(set(different)) == len(different)
    assert L.call_key("op", x)[1] is None  # CPU tensors: no CUDA device is asked for


class FakeCompiled:
    function, packed_metadata = 7, "meta"

    def __init__(self):
        self.runs = []

    def run(self, g0, g1, g2, stream, function, metadata, *rest):
        self.runs.append(((g0, g1, g2), stream, rest[3:]))


class FakeKernel(JITFunction):
    """A JITFunction as far as `isinstance` goes: its JIT call records the launch and returns a compiled
    stand-in."""

    def __init__(self, name):  # not JITFunction's, which parses a Python function's source
        self.__name__ = name
        self.jit_calls = []
        self.compiled = FakeCompiled()

    def __getitem__(self, grid):
        def jit_call(*args, **options):
            self.jit_calls.append((grid, args))
            return self.compiled
        return jit_call


class FakeDriver:
    class active:
        @staticmethod
        def get_current_device():
            return 0

        @staticmethod
        def get_current_stream(device):
            return 1234


def test_launches_reuse_by_position(monkeypatch):
    monkeypatch.setattr(L, "driver", FakeDriver)
    a, b = FakeKernel("a"), FakeKernel("b")
    key = ("test launches", "reuse")
    for n in (10, 20, 30):
        run = L.Launches(key)
        run(a, (n,), "x", n)
        run(b, (n, 2), "y", n, num_warps=8)
    assert [call[0] for call in a.jit_calls] == [(10,)] and [call[0] for call in b.jit_calls] == [(10, 2)]
    assert a.compiled.runs == [((20, 1, 1), 1234, ("x", 20)), ((30, 1, 1), 1234, ("x", 30))]
    assert b.compiled.runs == [((20, 2, 1), 1234, ("y", 20)), ((30, 2, 1), 1234, ("y", 30))]
    with pytest.raises(RuntimeError, match="the key misses"):
        L.Launches(key)(b, (1,), "y", 1)


def test_interpreted_kernels_are_never_kept():
    calls = []

    class Interpreted:
        __name__ = "interpreted"

        def __getitem__(self, grid):
            return lambda *args, **options: calls.append(grid)

    key = ("test launches", "interpreted")
    for _ in range(2):
        L.Launches(key)(Interpreted(), (3,), 1)
    assert calls == [(3,), (3,)] and L._CALLS[key] == []
