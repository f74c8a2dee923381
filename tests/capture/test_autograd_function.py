"""Custom torch.autograd.Function during capture (kiln/capture/values/autograd_function.py).

`MyFunction.apply(...)` is one graph node, as under torch.compile (one graph where torch makes one); the
user's forward and backward run as in eager, through every backend. Each case compares values and input
gradients with eager, and the graph count with torch.compile's (a counting backend).
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch.autograd.function import once_differentiable

import kiln
from support.autograd import Cube
from support.capture import CountingBackend


class ScaleAndShift(torch.autograd.Function):
    """Two tensor inputs, a Python number, two outputs (one marked non-differentiable)."""

    @staticmethod
    def forward(ctx, x, y, scale):
        ctx.scale = scale
        ctx.save_for_backward(x, y)
        index = (x > 0).to(torch.int64)
        ctx.mark_non_differentiable(index)
        return x * y * scale, index

    @staticmethod
    @once_differentiable
    def backward(ctx, grad, _grad_index):
        x, y = ctx.saved_tensors
        return grad * y * ctx.scale, grad * x * ctx.scale, None


class Clamp(torch.autograd.Function):
    """The setup_context spelling: forward takes no ctx."""

    @staticmethod
    def forward(x, low):
        return x.clamp(min=low)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, low = inputs
        ctx.save_for_backward(x >= low)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


class ReadsAValue(torch.autograd.Function):
    """A forward that reads a tensor's value: it cannot run on fake tensors, so the call breaks the graph."""

    @staticmethod
    def forward(ctx, x):
        return x * float(x.sum())

    @staticmethod
    def backward(ctx, grad):
        return grad


def cube_then_sin(x):
    return Cube.apply(x * 2).sin()


def two_outputs(x, y):
    out, index = ScaleAndShift.apply(x, y, 0.5)
    return out + index, index


def setup_context_style(x):
    return Clamp.apply(x, 0.1).exp()


def grad_inside(x):
    y = Cube.apply(x + 1)
    (gx,) = torch.autograd.grad(y.sum(), x)  # a graph break under torch.compile too
    return gx * 2


def value_reading_forward(x):
    return ReadsAValue.apply(x.cos()) + 1


CASES = {
    "cube_then_sin": (cube_then_sin, 1),
    "two_outputs": (two_outputs, 2),
    "setup_context_style": (setup_context_style, 1),
    "grad_inside": (grad_inside, 1),
    "value_reading_forward": (value_reading_forward, 1),
}


def _inputs(n):
    torch.manual_seed(0)
    return [torch.randn(3, 4, requires_grad=True) for _ in range(n)]


def _run(fn, n, compile_=None, **options):
    args = _inputs(n)
    call = compile_(fn, **options) if compile_ else fn
    out = call(*args)
    outputs = out if isinstance(out, tuple) else (out,)
    differentiable = [o for o in outputs if o.requires_grad]
    if differentiable:
        sum(o.sum() for o in differentiable).backward()
    return outputs, [a.grad for a in args]


def _assert_same(actual, expected):
    (out, grads), (eout, egrads) = actual, expected
    for a, e in zip(out, eout):
        torch.testing.assert_close(a, e)
    for a, e in zip(grads, egrads):
        if e is None:
            assert a is None
        else:
            torch.testing.assert_close(a, e)


@pytest.mark.parametrize("name", list(CASES))
def test_graph_count_at_most_torch_compile(name):
    fn, n = CASES[name]
    expected = _run(fn, n)
    counts = {}
    for label, compile_ in (("kiln", kiln.compile), ("torch", torch.compile)):
        torch._dynamo.reset()
        backend = CountingBackend()
        _assert_same(_run(fn, n, compile_, backend=backend), expected)
        counts[label] = backend.graphs
    assert counts["kiln"] <= counts["torch"], counts


@pytest.mark.sampled(every=2, classes=("name",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", ["cube_then_sin", "two_outputs", "setup_context_style"])
def test_user_backward_runs_through_kilns_backends(name, backend):
    fn, n = CASES[name]
    _assert_same(_run(fn, n, kiln.compile, backend=backend, fullgraph=True), _run(fn, n))


def test_redefining_backward_after_compiling_recompiles():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    compiled = kiln.compile(lambda x: Double.apply(x), backend="eager")
    x = torch.randn(3, requires_grad=True)
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    Double.backward = staticmethod(lambda ctx, grad: grad * 5)
    x.grad = None
    compiled(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 5.0))
