"""Scalar arguments that arrive as size symbols (kiln/lower/ops/common.py `scalar_operand`).

Under `dynamic=True` an int argument of the frame becomes a symbol, so an op's alpha or fill value reaches its
lowering as a sympy expression, not a number. Folding it to a constant (`float(alpha)`) raised TypeError and the
graph ran through ATen. Each case compiles strict and runs at several values, with eager's results.
"""
from __future__ import annotations

import pytest
import torch

import kiln

CASES = {  # (x, index, source, an int) -> a tensor
    "index_add_alpha": lambda x, index, source, n: torch.index_add(x, 0, index, source, alpha=n),
    "index_fill_value": lambda x, index, source, n: x.index_fill(0, index, n),
    "scatter_value": lambda x, index, source, n: x.scatter(0, index, n),
    "scatter_value_dense": lambda x, index, source, n: x.scatter(0, index.repeat(2), n),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("shape", [(), (5,)])
def test_an_int_argument_made_symbolic_reaches_the_kernel(name, shape):
    fn = CASES[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    x = torch.randn(shape, dtype=torch.float64)
    index = torch.tensor([0, 3][: (2 if shape else 1)])
    source = torch.randn(index.shape if shape else (), dtype=torch.float64)
    for n in (-1, 2, 3, 7):
        torch.testing.assert_close(compiled(x, index, source, n), fn(x, index, source, n))
