"""Special functions, replication padding's and adaptive average pooling's backwards decomposed into ops kiln lowers
(kiln/lower/special_decompositions.py), compared with
eager forward and backward at float32's and float64's OpInfo tolerances, with no ATen extern left.

erfcx's inputs span its three regimes (exp(x^2) erfc(x) for negative x, where ATen's float kernel rounds
x^2 to float; the product for moderate positive x; the asymptotic series from 25) and its special values.
"""
from __future__ import annotations

import math

import pytest
import torch

import kiln
from support.lowering import check, check_triton, count_externs

aten = torch.ops.aten
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


def _ndtri_inputs(dtype):
    """Uniform p, both tails down to 1e-300 (and to 1 - 1e-16), each branch's edge, and the domain's ends."""
    uniform = torch.linspace(0, 1, 1001, dtype=torch.float64)
    tails = torch.logspace(-300, -1, 300, dtype=torch.float64)
    edges = torch.tensor([math.exp(-2), 1 - math.exp(-2), math.exp(-32), 0.5, 0.0, 1.0, -0.5, 1.5, nan, inf])
    return torch.cat([uniform, tails, 1 - tails, edges]).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_ndtri_forward(dtype):
    compiled = check(torch.special.ndtri, _ndtri_inputs(dtype))
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


def test_ndtri_of_integers_and_triton():
    check(torch.special.ndtri, torch.tensor([-1, 0, 1, 2]))
    check_triton(torch.special.ndtri, _ndtri_inputs(torch.float32))


@pytest.mark.parametrize("fn", [torch.special.erfcx, torch.special.log_ndtr, torch.special.ndtri],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_gradients_match_eager(fn, dtype):
    """The backward (erfcx's and ndtri's use their result; log_ndtr's forward is a reference built on erfcx)."""
    x = torch.linspace(-8, 30, 401, dtype=dtype)
    x = torch.special.ndtr(x / 8) if fn is torch.special.ndtri else x

    def loss(t):
        return fn(t).sum()

    x_eager = x.clone().requires_grad_()
    x_kiln = x.clone().requires_grad_()
    grad_eager, = torch.autograd.grad(loss(x_eager), x_eager)
    grad_kiln, = torch.autograd.grad(kiln.compile(loss, fullgraph=True)(x_kiln), x_kiln)
    # ndtri's gradient sqrt(2 pi) exp(x^2 / 2) magnifies the last float32 bit of x (eager's kernel evaluates
    # in float, kiln's in double) by x^2, about 12 at p = 0.9997
    tol = dict(rtol=1e-5, atol=1e-5) if fn is torch.special.ndtri and dtype == torch.float32 else {}
    torch.testing.assert_close(grad_kiln, grad_eager, **tol)


REPLICATION_PAD_BACKWARDS = {1: aten.replication_pad1d_backward, 2: aten.replication_pad2d_backward,
                             3: aten.replication_pad3d_backward}
# (before, after) per padded dim, last dim first; negative pads crop
PADS = {"both_sides": [2, 1], "one_side": [0, 3], "crop_before": [-1, 2], "crop_both": [-1, -1]}


@pytest.mark.sampled(every=2, classes=("ndim", "pads"))
@pytest.mark.parametrize("pads", list(PADS))
@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_replication_pad_backward(ndim, pads):
    """The backward alone, traced through kiln's table: every padded gradient lands on its edge input."""
    g = torch.Generator().manual_seed(ndim)
    padding = PADS[pads] * ndim
    x = torch.randn(2, 3, *[4 + k for k in range(ndim)], generator=g)
    grad = torch.randn(torch.nn.functional.pad(x, padding, mode="replicate").shape, generator=g)
    backward = REPLICATION_PAD_BACKWARDS[ndim]
    compiled = check(lambda g_, x_: backward(g_, x_, padding), grad, x)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_replication_pad_gradient_matches_eager(dtype):
    x = torch.randn(2, 3, 5, 6, dtype=dtype)

    def loss(t):
        return (torch.nn.functional.pad(t, [1, -2, 3, 0], mode="replicate") ** 2).sum()

    x_eager, x_kiln = x.clone().requires_grad_(), x.clone().requires_grad_()
    grad_eager, = torch.autograd.grad(loss(x_eager), x_eager)
    grad_kiln, = torch.autograd.grad(kiln.compile(loss, fullgraph=True)(x_kiln), x_kiln)
    torch.testing.assert_close(grad_kiln, grad_eager)


# (input size, output size): dividing sizes, overlapping windows, an output larger than the input, global
ADAPTIVE_CASES = {"divides": ((1, 2, 8, 8), (4, 2)), "overlaps": ((2, 3, 7, 5), (3, 2)),
                  "no_batch": ((3, 9, 9), (4, 4)), "upsamples": ((1, 1, 5, 7), (7, 9)),
                  "global": ((1, 2, 6, 6), (1, 1))}


@pytest.mark.sampled(every=2, classes=("case",))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("case", list(ADAPTIVE_CASES))
def test_adaptive_avg_pool2d_backward(case, dtype):
    in_size, out_size = ADAPTIVE_CASES[case]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(in_size, generator=g, dtype=dtype)
    grad = torch.randn(aten._adaptive_avg_pool2d(x, out_size).shape, generator=g, dtype=dtype)
    grad.view(-1)[0] = inf  # reaches only the inputs of its windows
    compiled = check(aten._adaptive_avg_pool2d_backward, grad, x)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


@pytest.mark.parametrize("case", list(ADAPTIVE_CASES))
def test_adaptive_avg_pool2d_gradient_matches_eager(case):
    in_size, out_size = ADAPTIVE_CASES[case]
    x = torch.randn(in_size)

    def loss(t):
        return (torch.nn.functional.adaptive_avg_pool2d(t, out_size) ** 2).sum()

    x_eager, x_kiln = x.clone().requires_grad_(), x.clone().requires_grad_()
    grad_eager, = torch.autograd.grad(loss(x_eager), x_eager)
    grad_kiln, = torch.autograd.grad(kiln.compile(loss, fullgraph=True)(x_kiln), x_kiln)
    torch.testing.assert_close(grad_kiln, grad_eager)
