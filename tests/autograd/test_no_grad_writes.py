"""Inputs that require grad written in place under no_grad inside the compiled function.

Eager lets a leaf that requires grad (a parameter, an input) be written under `torch.no_grad()`: autograd
records nothing, the leaf stays a leaf, and the gradients of later uses flow to it as before (weight
clipping, an EMA, a hand-written SGD step). kiln traces such writes on a copy; the copy's new value is
written back outside autograd, as eager's write was.
"""
import pytest
import torch

import kiln


def scale_a_leaf(w, x):
    with torch.no_grad():
        w.mul_(2)
    return (w * x).sum()


def clamp_a_slice(w, x):
    with torch.no_grad():
        w[:, ::2].clamp_(-0.5, 0.5)
    return w @ x


def zero_a_row_of_a_view(w, x):
    t = w.t()
    with torch.no_grad():
        t[0] = 0
    return t.sum(0) * x[0]


def sgd_step(w, x):
    loss = (w * x).sum()
    with torch.no_grad():
        w.sub_(0.1 * x)
    return loss


def write_then_read_under_grad(w, x):
    with torch.no_grad():
        w.add_(x)
    y = w * 3  # saves nothing of w: the write below does not spoil a backward
    with torch.set_grad_enabled(False):
        w.div_(2)
    return y, w + 1


def nothing_returned(w, x):
    with torch.no_grad():
        w[1:].fill_(3)


PROGRAMS = [scale_a_leaf, clamp_a_slice, zero_a_row_of_a_view, sgd_step, write_then_read_under_grad, nothing_returned]


def make(leaf: bool):
    w = torch.linspace(-1.0, 1.0, 9).reshape(3, 3).clone().requires_grad_(True)  # a leaf of its own storage
    x = torch.linspace(0.5, 2.0, 9).reshape(3, 3)
    return (w if leaf else w * 1), x, w


@pytest.mark.sampled(every=2, classes=("program", "leaf"))
@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "non_leaf"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_no_grad_write_of_an_input_that_requires_grad(program, backend, leaf):
    e_w, e_x, e_leaf = make(leaf)
    k_w, k_x, k_leaf = make(leaf)
    expected = program(e_w, e_x)
    actual = kiln.compile(program, backend=backend)(k_w, k_x)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(k_w, e_w)
    assert (k_w.is_leaf, k_w.requires_grad) == (e_w.is_leaf, e_w.requires_grad)
    outs = [o for o in (expected if isinstance(expected, tuple) else (expected,)) if o is not None]
    if outs:
        sum(o.sum() for o in outs).backward()
        sum(o.sum() for o in (actual if isinstance(actual, tuple) else (actual,))).backward()
        torch.testing.assert_close(k_leaf.grad, e_leaf.grad)


def write_what_the_backward_saved(w, x):
    y = w * w
    with torch.no_grad():
        w.div_(2)
    return y


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_no_grad_write_of_a_saved_input_fails_the_backward(backend):
    """The write is hidden from autograd, not from its version check: eager's backward raises, so must kiln's."""
    e_w, e_x, _ = make(True)
    k_w, k_x, _ = make(True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        write_what_the_backward_saved(e_w, e_x).sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        kiln.compile(write_what_the_backward_saved, backend=backend)(k_w, k_x).sum().backward()
    torch.testing.assert_close(k_w, e_w)


class Clipped(torch.nn.Module):
    """A layer that clips its own weight under no_grad in forward."""
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(-2.0, 2.0, 6).reshape(2, 3))

    def forward(self, x):
        with torch.no_grad():
            self.weight.clamp_(-1, 1)
        return x @ self.weight.t()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_module_clips_its_parameter_in_forward(backend):
    eager, compiled = Clipped(), Clipped()
    x = torch.randn(4, 3)
    step = kiln.compile(compiled, backend=backend)
    for _ in range(2):
        eager(x).square().sum().backward()
        step(x).square().sum().backward()
        torch.testing.assert_close(compiled.weight, eager.weight)
        torch.testing.assert_close(compiled.weight.grad, eager.weight.grad)
    assert compiled.weight.is_leaf
