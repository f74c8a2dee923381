"""Context managers used as decorators (`@torch.no_grad()` on a nested function) and contexts made but not
yet entered when a graph break comes: each compared with eager, gradients included."""
import contextlib

import torch

import kiln
from support.capture import check

LOG = []


@contextlib.contextmanager
def tagged(name):
    LOG.append("enter " + name)
    yield
    LOG.append("exit " + name)


@torch.no_grad()
def scaled_without_grad(v):
    return v * 4


@torch.enable_grad()
def doubled_with_grad(v):
    return v * 2


def _x():
    return torch.randn(3, requires_grad=True)


def no_grad_decorator(x):
    @torch.no_grad()
    def helper(v):
        return v * 4

    return helper(x) + x, torch.is_grad_enabled()


def enable_grad_decorator_inside_no_grad(x):
    @torch.enable_grad()
    def helper(v):
        return v * 2

    with torch.no_grad():
        return helper(x), x * 3


def decorated_helper_sees_its_mode(x):
    @torch.no_grad()
    def helper(v):
        return v * 2, torch.is_grad_enabled()

    y, mode = helper(x)
    return y, mode, x.sin(), torch.is_grad_enabled()


def decorated_helper_raises(x):
    @torch.no_grad()
    def helper(v):
        raise ValueError("bad")

    try:
        helper(x)
    except ValueError:
        pass
    return x * 2, torch.is_grad_enabled()


def decorated_helper_with_break(x):
    @torch.no_grad()
    def helper(v):
        kiln.graph_break()
        return v * 2

    return helper(x) + x, x.cos()


def inference_mode_decorator(x):
    @torch.inference_mode()
    def helper(v):
        return v + 1

    return helper(x.detach()), x * 2


def user_context_manager_decorator(x):
    @tagged("t")
    def helper(v):
        LOG.append("body")
        return v - 1

    return helper(x), x * 2


def functions_decorated_at_definition(x):
    with torch.no_grad():
        y = doubled_with_grad(x)
    return scaled_without_grad(x) + x, y


def context_made_before_a_break(x):
    ctx = torch.no_grad()
    kiln.graph_break()
    with ctx:
        y = x * 2
    return y, x * 3


def test_no_grad_decorator():
    check(no_grad_decorator, _x())


def test_enable_grad_decorator_inside_no_grad():
    check(enable_grad_decorator_inside_no_grad, _x())


def test_decorated_helper_sees_its_mode():
    check(decorated_helper_sees_its_mode, _x())


def test_decorated_helper_raises_restores_the_mode():
    check(decorated_helper_raises, _x())


def test_decorated_helper_with_a_graph_break():
    # second=False: the continuation guards the nested function by identity, a new object every call
    check(decorated_helper_with_break, _x(), second=False)


def test_inference_mode_decorator():
    check(inference_mode_decorator, _x(), second=False)  # a break, then as above


def test_user_context_manager_as_decorator_runs_in_order():
    LOG.clear()
    user_context_manager_decorator(_x())
    expected = list(LOG)
    LOG.clear()
    kiln.compile(user_context_manager_decorator, backend="eager")(_x())
    assert LOG == expected == ["enter t", "body", "exit t"]


def test_context_made_before_a_graph_break():
    check(context_made_before_a_break, _x())


def test_functions_decorated_at_definition():
    check(functions_decorated_at_definition, _x())
