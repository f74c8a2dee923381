"""Inputs that require grad but whose history no output reaches: detached or read under no_grad inside.

Eager's ops on `t.detach()` have no edge to t's history, so a backward never visits it: t may come from a
graph already run backward and freed (a loss computed, `.backward()` called, then `loss.detach()` used on).
A compiled region that took t as a differentiable input would link its backward node to that freed graph,
and the backward raised "Trying to backward through the graph a second time".
"""
import pytest
import torch

import kiln


def where_with_a_detached_input(a, t):
    t = t.detach()
    return torch.where(a > t, a, t).sin()


def add_a_detached_input(a, t):
    return (a + t.detach()) * 2


def read_under_no_grad(a, t):
    with torch.no_grad():
        scale = t * 2
    return a * scale


def one_reached_one_not(a, t):
    return a * t.detach(), (a * 0 + t).sum()


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [where_with_a_detached_input, add_a_detached_input, read_under_no_grad],
                         ids=lambda f: f.__name__)
def test_input_with_a_freed_graph(program, backend):
    w = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 6).reshape(2, 3))

    def run(fn):
        a = torch.linspace(-2.0, 2.0, 12).reshape(4, 3).requires_grad_(True)
        t = (w * 3).square().mean()
        t.backward()  # t's graph is freed
        fn(a, t).sum().backward()
        return a.grad

    torch.testing.assert_close(run(kiln.compile(program, backend=backend)), run(program))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_input_reached_by_one_output_only(backend):
    """The same input detached for one output and differentiated through the other: its gradient is the latter's."""
    def run(fn):
        a = torch.linspace(-2.0, 2.0, 12).reshape(4, 3).requires_grad_(True)
        t = torch.tensor(0.5, requires_grad=True)
        x, y = fn(a, t * 1)
        (x.sum() + y).backward()
        return a.grad, t.grad

    torch.testing.assert_close(run(kiln.compile(one_reached_one_not, backend=backend)), run(one_reached_one_not))
