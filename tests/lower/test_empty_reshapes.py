"""Reshapes of empty tensors lower as views: a size-0 dim has no factor relation with the others.

Finding which old dims a new dim spans divides size products; with a 0 among them the quotient is sympy's
complex infinity, which compares with nothing, and the graph fell back to ATen (`TypeError: Invalid comparison
of non-real zoo`; fuzz seeds 100074, 100419, 100548). Each case runs strict through kiln's default backend, so a
fallback fails it, and compares with eager.
"""
import pytest
import torch

import kiln
from kiln.lower.index import proper_factor

CASES = {
    "split a dim beside an empty one": (lambda x: (x.reshape(0, 2, 3) + 1).sum(-1), (0, 6)),
    "merge an empty dim": (lambda x: x.reshape(-1) * 2, (3, 0, 4)),
    "empty batch of rows": (lambda x: x.reshape(0, 10).relu(), (0, 2, 5)),
    "view then transpose": (lambda x: x.view(4, 0, 3).transpose(0, 2) - 1, (4, 0, 3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_an_empty_reshape_compiles_and_matches_eager(name):
    fn, shape = CASES[name]
    x = torch.randn(shape)
    got = kiln.compile(fn)(x)
    torch.testing.assert_close(got, fn(x))


def test_no_factor_relation_with_a_zero_size():
    import sympy

    assert not proper_factor(sympy.Integer(0), sympy.Integer(6))
    assert not proper_factor(sympy.Integer(3), sympy.Integer(0))
    assert proper_factor(sympy.Integer(2), sympy.Integer(6))
