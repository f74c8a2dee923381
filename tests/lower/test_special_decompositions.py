"""Special functions decomposed into ops kiln lowers (kiln/lower/special_decompositions.py), compared with
eager forward and backward at float32's and float64's OpInfo tolerances, with no ATen extern left.

erfcx's inputs span its three regimes (exp(x^2) erfc(x) for negative x, where ATen's float kernel rounds
x^2 to float; the product for moderate positive x; the asymptotic series from 25) and its special values.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.lowering import check, check_triton, count_externs

nan, inf = float("nan"), float("inf")


def _erfcx_inputs(dtype):
    """A sweep over [-30, 60] (overflow to inf below -9.4 in float32, -26.6 in float64) and special values."""
    sweep = torch.linspace(-30, 60, 1801, dtype=torch.float64)
    edges = torch.tensor([nan, inf, -inf, 0.0, -0.0, 24.999, 25.0, 25.001, 1e6, -9.41, -6.1, 1e-30])
    return torch.cat([sweep, edges]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_erfcx_forward(dtype):
    compiled = check(torch.special.erfcx, _erfcx_inputs(dtype))
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool], ids=str)
def test_erfcx_of_integers_is_float32(dtype):
    x = torch.arange(-12, 12).to(dtype)
    compiled = check(torch.special.erfcx, x)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


def test_erfcx_triton():
    check_triton(torch.special.erfcx, _erfcx_inputs(torch.float32))


@pytest.mark.parametrize("fn", [torch.special.erfcx, torch.special.log_ndtr], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_gradients_match_eager(fn, dtype):
    """The backward (erfcx's uses its result; log_ndtr's forward is a reference built on erfcx)."""
    x = torch.linspace(-8, 30, 401, dtype=dtype)

    def loss(t):
        return fn(t).sum()

    x_eager = x.clone().requires_grad_()
    x_kiln = x.clone().requires_grad_()
    grad_eager, = torch.autograd.grad(loss(x_eager), x_eager)
    grad_kiln, = torch.autograd.grad(kiln.compile(loss, fullgraph=True)(x_kiln), x_kiln)
    torch.testing.assert_close(grad_kiln, grad_eager)
