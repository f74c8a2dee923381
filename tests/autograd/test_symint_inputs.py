"""Graphs with SymInt inputs (an int input made a symbol) through kiln's AOT stage and code generator.

kiln's capture passes such a graph an int per call; torch.compile, behind which kiln's backends also work,
passes the SymInt itself as the example input. The AOT stage makes it an input of its ATen graphs
(`signature.IntSpec`): baking the first value in would return the first call's rows on every later call.
"""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

import kiln
from kiln.autograd import aot_eager
from support.capture import assert_same

BACKENDS = {"aot_eager": aot_eager, "inductor": kiln.inductor}


def window(x, n):
    return x[n:n + 3] * n


@pytest.mark.parametrize("backend", BACKENDS)
def test_behind_torch_compile(backend):
    torch._dynamo.reset()
    compiled = torch.compile(window, backend=BACKENDS[backend])
    for n in (2, 3, 5, -4, 9):
        x = torch.randn(12, 2)
        assert_same(window(x, n), compiled(x, n))


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_behind_torch_compile(backend):
    torch._dynamo.reset()
    compiled = torch.compile(window, backend=BACKENDS[backend])
    for n in (2, 3, 5):
        x = torch.randn(12, 2)
        ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        compiled(ours, n).sum().backward()
        window(theirs, n).sum().backward()
        assert_same(theirs.grad, ours.grad)
