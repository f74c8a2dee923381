"""Extern arguments over symbolic sizes that sympy cannot sign (kiln/lower/values.py `buffer_view`).

Under `dynamic=True` an int argument becomes a symbol that may be negative as far as sympy knows (`groups`), and
a size made from it (a channel count `s0*s1`) has a stride of unknown sign. Lowering took such a buffer for a
reversed read and could not pass it to the extern (TypeError, the graph ran through ATen). Each case compiles
strict, at two sizes, with eager's values and gradients.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln

G = torch.Generator().manual_seed(0)

CASES = {  # (x of (batch, 4, length), weight) -> a tensor
    "grouped_conv1d": lambda x, w, groups: F.conv1d(x, w, stride=3, padding=1, groups=groups, dilation=2),
    "group_norm": lambda x, w, groups: F.group_norm(x, groups, w[:, 0, 0], w[:, 0, 1]),
    "grouped_conv1d_then_reshape": lambda x, w, groups: F.conv1d(x, w, groups=groups).reshape(x.shape[0], -1).sin(),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_extern_reads_a_buffer_whose_strides_have_an_int_symbol(name):
    fn = CASES[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for batch, length, groups in ((2, 9, 2), (3, 12, 4)):
        x = torch.randn(batch, 4, length, generator=G, dtype=torch.float64, requires_grad=True)
        w = torch.randn(4, 4 // groups, 3, generator=G, dtype=torch.float64, requires_grad=True)
        expected, got = fn(x, w, groups), compiled(x, w, groups)
        torch.testing.assert_close(got, expected)
        cotangent = torch.randn(expected.shape, generator=G, dtype=torch.float64)
        for a, b in zip(torch.autograd.grad(got, (x, w), cotangent), torch.autograd.grad(expected, (x, w), cotangent)):
            torch.testing.assert_close(a, b)
