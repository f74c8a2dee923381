"""An input that is a leaf requiring grad and a view of another tensor (`base[1:].requires_grad_()`), written in
place by the compiled code.

Eager: the write (under no_grad, through any view of the leaf) bumps the base's version, and autograd rebuilds
the views of the leaf taken before it as views of the base, which requires no grad, so what is computed from
them afterwards gives the leaf no gradient. A compiled graph returns such a view taken after its write, with the
leaf's history: a gradient where eager's is None (fuzz seed 450555). Such a call runs the captured graph op by
op, a counted fallback; a leaf that is no view, written the same way, is compiled (its views keep the leaf's
history in eager too). Eager and kiln side by side: outputs, `requires_grad`, and the leaf's gradient.
"""
import pytest
import torch

import kiln
from kiln import fallbacks


def earlier_view_read_after_the_write(c):
    t = c.t()
    torch.nn.init.zeros_(c[..., :1])
    return t + 1


def earlier_view_read_after_a_write_under_no_grad(c):
    t = c * 1.0
    v = c[0]
    with torch.no_grad():
        c[1:].mul_(2)
    return t.sum() + v.sum()


def leaf_read_after_the_write(c):
    with torch.no_grad():
        c.mul_(0.5)
    return (c * 3).exp()


PROGRAMS = [earlier_view_read_after_the_write, earlier_view_read_after_a_write_under_no_grad,
            leaf_read_after_the_write]


def leaf_view():
    return torch.linspace(-1.0, 1.0, 10)[1:5].view(2, 2).requires_grad_()


def plain_leaf():
    return torch.linspace(-1.0, 1.0, 10)[1:5].view(2, 2).clone().requires_grad_()


def outcome(fn, c):
    out = fn(c)
    requires_grad = out.requires_grad
    if requires_grad:
        out.sum().backward()
    return out.detach(), requires_grad, c.grad


def assert_same(got, want):
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]
    assert (got[2] is None) == (want[2] is None), (got[2], want[2])
    if want[2] is not None:
        torch.testing.assert_close(got[2], want[2])


@pytest.mark.allows_fallback("a graph writing a leaf view runs op by op")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_a_written_leaf_view_gets_eagers_gradient(program, backend):
    want = outcome(program, leaf_view())
    got = outcome(kiln.compile(program, backend=backend), leaf_view())
    assert_same(got, want)
    assert any("a view and a leaf that requires grad" in f.describe() for f in fallbacks.records())


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_a_written_plain_leaf_is_compiled_with_eagers_gradient(program, backend):
    compiled = kiln.compile(program, backend=backend)
    assert_same(outcome(compiled, plain_leaf()), outcome(program, plain_leaf()))


@pytest.mark.allows_fallback("a graph writing a leaf view runs op by op")
def test_the_same_graph_called_with_a_plain_leaf_then_a_leaf_view():
    program = earlier_view_read_after_the_write
    compiled = kiln.compile(program)
    assert_same(outcome(compiled, plain_leaf()), outcome(program, plain_leaf()))
    assert not fallbacks.records()
    assert_same(outcome(compiled, leaf_view()), outcome(program, leaf_view()))
