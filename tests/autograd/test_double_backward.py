"""Differentiating a compiled graph's gradient (create_graph=True, then backward again), side by side with eager.

A compiled backward is one autograd node whose kernels record nothing. Run with create_graph=True, kiln runs
the backward graph's ATen ops under autograd instead, which differentiates exactly when every tensor the
backward reads is a forward input, with its history (`x ** 3` reads x; a linear layer reads its weight). A
backward that reads a value the forward computed (`tanh(x @ w)` reads the tanh) would lose the terms through
it: its gradient raises a clear error when differentiated, never a silently wrong second derivative.
"""
from __future__ import annotations

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


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_backward_reading_computed_values_raises_when_differentiated(backend):
    """tanh's backward reads the tanh: differentiated as ops, it would drop the term through it."""
    def fn(x, w):
        return (x @ w).tanh().sum()

    x, w = inputs()
    (expected,) = torch.autograd.grad(fn(x, w), x)
    (gx,) = torch.autograd.grad(kiln.compile(fn, backend=backend)(x, w), x, create_graph=True)
    torch.testing.assert_close(gx, expected)  # the first derivative is right
    with pytest.raises(RuntimeError, match="kiln: double backward"):
        gx.sum().backward()
