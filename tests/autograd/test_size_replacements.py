"""An input's geometry read before and after the analysis run (kiln/autograd/signature.py `_analyze`).

Under `dynamic=True` a view whose sizes come from arguments (`x.reshape(a, b, c)` of an `(s0, s1)` input) makes
the shape environment replace one size by the others (`s0 = s2*s3`): every size expression read afterwards is
rewritten, the input's included. Read once before the run and once after, an input no op restrided looked
restrided, and the runtime's `as_strided_` on a leaf that requires grad raised eager's in-place error (the frame
ran eagerly). Each case compiles strict at several shapes, with eager's outputs and gradients.
"""
from __future__ import annotations

import pytest
import torch

import kiln

G = torch.Generator().manual_seed(0)

CASES = {  # (x, a shape) -> a tensor
    "reshape": lambda x, shape: x.reshape(shape),
    "view": lambda x, shape: x.view(shape),
    "reshape_then_sin": lambda x, shape: x.reshape(shape).sin(),
}
SHAPES = [((5, 5, 5), (25, 5)), ((25, 5), (5, 5, 5)), ((25, 5), (5, -1, 5)), ((6, 4), (2, 3, 4))]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_view_with_argument_sizes_leaves_a_leaf_input_alone(name):
    fn = CASES[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for shape, new in SHAPES:
        x = torch.randn(shape, generator=G, dtype=torch.float64, requires_grad=True)
        expected, got = fn(x, new), compiled(x, new)
        torch.testing.assert_close(got, expected)
        assert x.is_leaf and x.shape == shape
        cotangent = torch.randn(expected.shape, generator=G, dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad(got, x, cotangent), torch.autograd.grad(expected, x, cotangent))
