"""An int argument read through arithmetic (`x.sum(dim=n % 2)`) recompiles when the expression changes.

kiln guards the value capture read, the expression `(n % 2) == 1`, not `n == 3` (values/operators.py
`_scalar_arithmetic`), as torch.compile guards the SymInt expression of an int it made dynamic. An int read
directly as a dim is specialized per value by both. Each case calls the function with a sequence of ints,
compares every result with eager's, and the number of graphs compiled with torch.compile's.
"""
import pytest
import torch
from torch._dynamo.testing import CompileCounter

import kiln
from support.capture import CountingBackend, assert_same


def remainder_as_dim(x, n):
    return x.sum(dim=n % 2) * n


def dim_directly(x, n):
    return x.sum(dim=n)


def offset_as_dim(x, n):
    return x.softmax(dim=n - 1) + n


def halved_as_size(x, n):
    return x.new_zeros(n // 2).sum() + x.sum() * (n // 2)


def reflected_and_chained(x, n):
    return x.sum(dim=1 - (n + 1) % 2) * (10 - n)


def compared_after_arithmetic(x, n):
    return x * 2 if n // 4 > 1 else x - 1


CASES = {
    "remainder_as_dim": (remainder_as_dim, [2, 3, 1, 5, 4]),
    "dim_directly": (dim_directly, [0, 1, 0, -1]),
    "offset_as_dim": (offset_as_dim, [1, 2, 1, 2]),
    "halved_as_size": (halved_as_size, [4, 5, 7, 6]),
    "reflected_and_chained": (reflected_and_chained, [3, 5, 4, 7]),
    "compared_after_arithmetic": (compared_after_arithmetic, [1, 2, 9, 12, 3]),
}


@pytest.mark.parametrize("name", CASES)
def test_int_read_through_arithmetic_recompiles_as_torch_compile(name):
    fn, values = CASES[name]
    x = torch.randn(3, 4)
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled_by_torch = torch.compile(fn, backend=counter)
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend)
    for n in values:
        compiled_by_torch(x, n)
        assert_same(fn(x, n), compiled(x, n))
    assert backend.graphs <= counter.frame_count


def test_int_as_a_slice_bound_recompiles_as_torch_compile():
    def prefix(x, n):
        return x.flatten()[: 10 - n] * 2

    x = torch.randn(3, 4)
    torch._dynamo.reset()
    counter = CompileCounter()
    backend = CountingBackend()
    compiled_by_torch, compiled = torch.compile(prefix, backend=counter), kiln.compile(prefix, backend=backend)
    for n in [3, 5, 4, 7]:
        compiled_by_torch(x, n)
        assert_same(prefix(x, n), compiled(x, n))
    assert backend.graphs <= counter.frame_count


def test_the_guard_is_on_the_expression():
    """The entry compiled for n=3 serves n=1 (same remainder) and not n=2."""
    backend = CountingBackend()
    compiled = kiln.compile(lambda x, n: x.sum(dim=n % 2), backend=backend)
    x = torch.randn(3, 4)
    for n, graphs in [(3, 1), (1, 1), (5, 1), (2, 2), (4, 2)]:
        assert_same(x.sum(dim=n % 2), compiled(x, n))
        assert backend.graphs == graphs
