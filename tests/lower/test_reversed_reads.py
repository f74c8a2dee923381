"""A reversed read (`flip`, and the backward of `cumsum`, which flips its gradient) is computed, never taken as
a view: torch's views have no negative strides, and a graph that returned or handed on a flipped buffer as a
view raised `as_strided: Negative strides are not supported` (fuzz seeds 650, 818, 980, 994, 1438)."""
from __future__ import annotations

import pytest
import torch

import kiln


def flipped_input(x):
    return x.flip(0), x.flip(-1) * 2


def flipped_intermediate_returned_twice(x):
    t = (x + 1).flip(0)
    return t, t[::2], t.flip(1)


def flipped_operand_of_a_matmul(x, w):
    return x.flip(1) @ w


def cumsum_views_returned(b):
    t = b.cumsum(0)
    return t, t[::2], t.mean()


@pytest.mark.parametrize("fn", [flipped_input, flipped_intermediate_returned_twice], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_flipped_outputs_are_eagers(fn, dtype):
    x = torch.randn(5, 4).to(dtype)
    for got, expected in zip(kiln.compile(fn)(x), fn(x)):
        assert got.shape == expected.shape and got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)


def test_a_flipped_operand_of_an_extern():
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(kiln.compile(flipped_operand_of_a_matmul)(x, w), flipped_operand_of_a_matmul(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [6, 4], ids=lambda n: f"rows{n}")
def test_cumsum_backward_flips_its_gradient_as_eager(dtype, rows):
    b = torch.randn(rows, 4).to(dtype).requires_grad_()
    twin = b.detach().clone().requires_grad_()
    got, expected = kiln.compile(cumsum_views_returned)(twin), cumsum_views_returned(b)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
    sum(o.float().sum() for o in got).backward()
    sum(o.float().sum() for o in expected).backward()
    torch.testing.assert_close(twin.grad, b.grad)
