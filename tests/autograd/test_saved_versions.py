"""Inputs whose values eager's backward saves, written after the graph ran (saved_versions.py): the backward raises
eager's error where eager's does, and runs where it does not.

A custom `torch.autograd.Function` saves with `ctx.save_for_backward`, which its backward node exposes as
`saved_tensors`, not as the `_saved_*` attributes of ATen's nodes: the values it saved were not watched, and a write
after the graph (in the next graph, or by the caller) left kiln's backward running where eager's raises (fuzz seed
407659).
"""
from __future__ import annotations

import pytest
import torch

import kiln


class Sine(torch.autograd.Function):
    """sin, saving its input for the backward."""

    @staticmethod
    def forward(x):
        return x.sin()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, = ctx.saved_tensors
        return grad * x.cos()


def sine_then_zero_after_a_break(c):
    t = Sine.apply(c) * 2
    kiln.graph_break()
    with torch.no_grad():
        c.zero_()
    return t


def sine_then_zero_another(c, d):
    t = Sine.apply(c) * 2
    kiln.graph_break()
    d.zero_()
    return t


def _run(program, fn) -> tuple[str, torch.Tensor | None]:
    w = torch.linspace(0.5, 2.0, 4, dtype=torch.float64).requires_grad_()
    args = (w * 1,) if program.__code__.co_argcount == 1 else (w * 1, torch.ones(3))
    out = fn(*args)
    try:
        out.sum().backward()
    except RuntimeError as e:
        assert "modified by an inplace operation" in str(e)
        return "raised", None
    return "ran", w.grad


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [sine_then_zero_after_a_break, sine_then_zero_another], ids=lambda f: f.__name__)
def test_a_value_a_custom_function_saved_is_watched(program, backend):
    expected = _run(program, program)
    actual = _run(program, kiln.compile(program, backend=backend))
    assert actual[0] == expected[0]
    if expected[1] is not None:
        torch.testing.assert_close(actual[1], expected[1])
