"""The specialisation key of kernels/triton/launch.py (pure Python, on CPU tensors): it separates
whatever makes the JIT compile another kernel (pointer alignment and dtype, ints that are 1, divide
by 16 or need 64 bits, constexpr values) and nothing else (float values, other aligned pointers)."""
import pytest
import torch

from kdispatch.kernels.triton.launch import _specialisation

SLOTS = ((False, True), (False, True), (False, False), (False, True), (True, True))  # x, n, m (unspecialised), a, C


def key(x, n, m=5, a=0.5, c=64):
    return _specialisation((x, n, m, a, c), SLOTS)


def test_what_separates_compiled_kernels():
    x = torch.zeros(64)
    assert key(x, 32) == key(torch.zeros(64), 48) == key(x, 32, m=7, a=3.0)
    different = [key(x, 32), key(x[1:], 32), key(x.double(), 32), key(x, 1), key(x, 33), key(x, 2**31),
                 key(x, 32, m=2**40), key(x, 32, c=128)]
    assert len(set(different)) == len(different)
    assert key(x, 32, m=1) == key(x, 32, m=3)  # do_not_specialize: only its width counts


def test_unknown_argument_types_are_refused():
    with pytest.raises(TypeError, match="tuple"):
        _specialisation(((1, 2),), ((False, True),))
