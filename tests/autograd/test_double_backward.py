"""Differentiating a compiled graph's gradient (create_graph=True, then backward again), side by side with eager.

A compiled backward is one autograd node whose kernels record nothing. Run with create_graph=True, kiln runs
the backward graph's ATen ops under autograd instead, which differentiates exactly when every tensor the
backward reads is a forward input, with its history (`x ** 3` reads x; a linear layer reads its weight). A
backward that reads a value the forward computed (`tanh(x @ w)` reads the tanh) would lose the terms through
it: those values are computed again from the call's inputs under autograd (second_order.py), and where that
cannot be (a random draw, an input written since) the gradient raises a clear error when differentiated, never
a silently wrong second derivative.
"""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn as nn

import kiln
from support.autograd import compile_module

BACKENDS = ["aot_eager", "inductor"]


def cube(x, w):
    return (x ** 3).sum()


def sine_times_weight(x, w):
    return (x.sin() * w).sum()


def squared_error(x, w):
    return ((x - w) ** 2).mean()


def softplus_of_product(x, w):
    return torch.nn.functional.softplus(x * w).sum()


def grad_inside(x, w):
    """The gradient taken inside the compiled function, as Dynamo's autograd tests do."""
    y = (x ** 3 * w).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    return g.sum()


def gradient_penalty(fn, x, w):
    """WGAN-GP's term: the norm of d fn / dx, differentiated again; x.grad and w.grad afterwards."""
    (gx,) = torch.autograd.grad(fn(x, w), x, create_graph=True)
    (gx ** 2).sum().backward()
    return x.grad, w.grad


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 4, generator=g, requires_grad=True), torch.randn(4, 4, generator=g, requires_grad=True)


@pytest.mark.sampled(every=2, classes=("fn",))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [cube, sine_times_weight, squared_error, softplus_of_product],
                         ids=lambda f: f.__name__)
def test_second_derivatives_match_eager(fn, backend):
    expected = gradient_penalty(fn, *inputs())
    got = gradient_penalty(kiln.compile(fn, backend=backend), *inputs())
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_taken_inside_the_compiled_function_is_differentiable(backend):
    x, w = inputs()
    grad_inside(x, w).backward()
    x2, w2 = inputs()
    kiln.compile(grad_inside, backend=backend)(x2, w2).backward()
    torch.testing.assert_close(x2.grad, x.grad)
    torch.testing.assert_close(w2.grad, w.grad)


def test_a_linear_layers_input_gradient_carries_the_weight_term():
    """d(lin(x))/dx is the weight: the penalty's gradient reaches the weight, as in eager."""
    lin = nn.Linear(3, 1)
    x = torch.randn(4, 3, requires_grad=True)
    compiled = compile_module(lin, [x])
    (gx,) = torch.autograd.grad(compiled(x).sum(), x, create_graph=True)
    gx.pow(2).sum().backward()
    expected = lin.weight.grad.clone()
    lin.weight.grad = None
    (gx,) = torch.autograd.grad(lin(x).sum(), x, create_graph=True)
    gx.pow(2).sum().backward()
    torch.testing.assert_close(expected, lin.weight.grad)


def tanh_of_product(x, w):
    return (x @ w).tanh().sum()  # tanh's backward reads the tanh, a value the forward computed


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backward_reading_computed_values_is_differentiated_through_them(backend):
    """The tanh the backward reads is computed again from x and w under autograd (second_order.py): the terms
    through it are eager's."""
    expected = gradient_penalty(tanh_of_product, *inputs())
    got = gradient_penalty(kiln.compile(tanh_of_product, backend=backend), *inputs())
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


def dropout_of_product(x, w):
    return torch.nn.functional.dropout(x @ w, 0.5).tanh().sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backward_that_cannot_recompute_raises_when_differentiated(backend):
    """A forward that draws random numbers (a second run would draw others), or an input written in place since
    the forward: the gradient is right, and differentiating it raises a clear error, never a wrong value."""
    x, w = inputs()
    (gx,) = torch.autograd.grad(kiln.compile(dropout_of_product, backend=backend)(x, w), x, create_graph=True)
    with pytest.raises(RuntimeError, match="kiln: double backward"):
        gx.sum().backward()
    x, w = inputs()
    v = w * 1  # an input that is no leaf, which eager's backward does not read, written before the backward
    out = kiln.compile(tanh_of_shifted, backend=backend)(x, v)
    with torch.no_grad():
        v.add_(1)
    (gx,) = torch.autograd.grad(out, x, create_graph=True)
    with pytest.raises(RuntimeError, match="kiln: double backward"):
        gx.sum().backward()


def tanh_of_shifted(x, w):
    return (x * 2 + w).tanh().sum()  # eager saves the tanh alone


def real_part_of_a_complex_slice(x, w):
    t = (x.to(torch.complex64) * (2.0 + 1.0j))[1:].real  # its backward scatters a complex gradient into zeros
    return ((t * w[1:]).sin() + t * t).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backward_through_complex_views_is_differentiated(backend):
    """ATen differentiates `slice_scatter` for real dtypes only: the code generator's table writes a slice's
    backward as one, so a complex gradient keeps eager's `slice_backward` (decompositions.py `VIEW_BACKWARDS`)."""
    def values():
        return torch.tensor([0.5, 1.0, -2.0], requires_grad=True), torch.tensor([1.0, 2.0, 3.0], requires_grad=True)

    expected = gradient_penalty(real_part_of_a_complex_slice, *values())
    got = gradient_penalty(kiln.compile(real_part_of_a_complex_slice, backend=backend), *values())
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


NORMED = nn.Sequential(nn.Linear(3, 3, bias=False), nn.BatchNorm1d(3), nn.Tanh()).eval()


def through_inference_mode(a):
    positives = len(a[a > 0])  # a graph break: the graphs after it take what the eager code made
    negated = (-a)._neg_view()
    with torch.inference_mode():
        print("inference", file=io.StringIO())  # another, inside the block
        total = (negated + 1).sum()  # an inference tensor: it has no version counter
    return NORMED((-a)._neg_view().exp().float().reshape(-1, 3)), positives, total


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_inference_tensor_input_is_kept_without_a_version(backend):
    """The inputs a differentiable backward may run the forward on again are kept with their versions; an inference
    tensor has none to read (reading it raised in the forward: fuzz seed 600307), and a write to it is not seen, as
    in eager."""
    a = torch.randn(3, dtype=torch.float64, requires_grad=True)
    for got, want in zip(kiln.compile(through_inference_mode, backend=backend)(a), through_inference_mode(a)):
        torch.testing.assert_close(got, want)
