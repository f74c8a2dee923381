"""Slices, selects and slice_scatters at a start that is an int argument made a symbol (`dynamic=True`).

A negative start counts from the end. Where tracing fixes the start's sign with a guard (`x[n:]`, `select`, a joint
graph with a backward), each sign compiles a graph of its own; where it leaves the sign open (`slice_scatter` at
inference), the lowering ran the op through ATen. The start is now a position computed at run time from either
sign (kiln/lower/ops/views.py `_from_end`): one graph serves both, strided slice_scatters included, with eager's
values.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.lowering import count_externs

CASES = {  # (x: (12, 5), src: (12, 5), an int start) -> a tensor
    "slice": lambda x, src, n: x[n:] * 2,
    "select": lambda x, src, n: x.select(0, n).exp(),
    "slice_scatter": lambda x, src, n: torch.slice_scatter(x, src[: 12 - n % 12], 0, n),
    "slice_scatter_step_2": lambda x, src, n: torch.slice_scatter(x, src[: (12 - n % 12 + 1) // 2], 0, n, None, 2),
    "slice_scatter_step_3_dim_1": lambda x, src, n: torch.slice_scatter(x.t(), src.t()[:, : (12 - n % 12 + 2) // 3],
                                                                          1, n, None, 3).sin(),
}
SIGN_GUARDED_BY_TRACING = {"slice", "select"}


STARTS = (2, 3, 5, -9, -7)  # no slice of length 1 (a size 1 specializes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_symbolic_start_of_either_sign_is_generated(name, compiled_graphs):
    """Inference: one graph for both signs where tracing leaves the sign open, eager's values, no ATen call."""
    fn = CASES[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    g = torch.Generator().manual_seed(0)
    x, src = torch.randn(12, 5, generator=g), torch.randn(12, 5, generator=g)
    for n in STARTS:
        torch.testing.assert_close(compiled(x, src, n), fn(x, src, n))
    assert len(compiled_graphs) == (2 if name in SIGN_GUARDED_BY_TRACING else 1), [
        g.artefacts["name"] for g in compiled_graphs]
    assert all(count_externs(g) == 0 for g in compiled_graphs), [str(g.artefacts["schedule"]) for g in compiled_graphs]


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_at_a_symbolic_start_of_either_sign(name, compiled_graphs):
    """Training: the backward slices the gradient at the same start (slice_scatter's source gradient); tracing
    the joint graph guards the start's sign, so each sign compiles its own graphs, each generated, with eager's
    gradients."""
    fn = CASES[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    g = torch.Generator().manual_seed(1)
    for n in STARTS:
        x, src = (torch.randn(12, 5, generator=g, requires_grad=True) for _ in range(2))
        expected, got = fn(x, src, n), compiled(x, src, n)
        cotangent = torch.randn(expected.shape, generator=g)
        for got_grad, expected_grad in zip(torch.autograd.grad(got, (x, src), cotangent, allow_unused=True),
                                           torch.autograd.grad(expected, (x, src), cotangent, allow_unused=True)):
            torch.testing.assert_close(got_grad, expected_grad)
    assert all(count_externs(g) == 0 for g in compiled_graphs), [str(g.artefacts["schedule"]) for g in compiled_graphs]
