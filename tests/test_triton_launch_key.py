"""The specialisation key of kernels/triton/launch.py (pure Python, on CPU tensors): it separates
whatever makes the JIT compile another kernel (pointer alignment and dtype, ints that are 1, divide
by 16 or need 64 bits) and nothing else (float values, other aligned pointers); constexprs, the
tail of the arguments, are keyed by value beside it."""
from kdispatch.kernels.triton.launch import _hooked, _specialisation

SPECIALISED = (True, True, False, True)  # x, n, m (do_not_specialize), a


def key(x, n, m=5, a=0.5):
    return _specialisation((x, n, m, a), SPECIALISED)


def test_what_separates_compiled_kernels():
    import torch

    x = torch.zeros(64)
    assert key(x, 32) == key(torch.zeros(64), 48) == key(x, 32, m=7, a=3.0)
    different = [key(x, 32), key(x[1:], 32), key(x.double(), 32), key(x, 1), key(x, 33), key(x, 2**31),
                 key(x, 32, m=2**40), key(x, 32, a=True), key(x, 32, a=None)]
    assert len(set(different)) == len(different)
    assert key(x, 32, m=1) == key(x, 32, m=3)  # do_not_specialize: only its width counts
    assert key(torch.nn.Parameter(torch.zeros(64)), 32) == key(x, 32)  # a Tensor subclass keys as a tensor


def test_launch_hooks_are_noticed():
    from triton import knobs

    assert not _hooked(None) and _hooked(lambda metadata: None)
    chain = type(knobs.runtime.launch_enter_hook)
    if hasattr(chain, "add"):  # Triton >= 3.5: a chain of hooks, empty by default
        empty = chain()
        assert not _hooked(empty)
        empty.add(lambda metadata: None)
        assert _hooked(empty)
