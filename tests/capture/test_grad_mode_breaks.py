"""Grad mode across graph breaks and inside graphs entered with grad mode off (issue 21, class 5).

The continuation after a break inside `with torch.no_grad():` resumes inside the block, and a graph entered
with grad mode off that turns it on (`enable_grad` inside `no_grad`) must record gradients for that part, under
every backend: outputs have eager's `requires_grad`, gradients eager's values, and grad mode after the call is
eager's. Each function gives torch.compile's graph count in `GRAPHS`.
"""
import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import graph_count


def break_inside_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("", end="")
        z = y + 1
    return z, x * 3


def break_inside_enable_grad(x):
    with torch.enable_grad():
        y = x * 2
        print("", end="")
        z = y * x
    return z, x * 3


def break_inside_nested_blocks(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 5
            print("", end="")
            c = b * x
        d = c + 1
    return a, c, d, x * 3


def break_inside_set_grad_enabled_block(x):
    with torch.set_grad_enabled(False):
        y = x * 2
        print("", end="")
        z = y * 2
    return z, x.sin()


def break_between_set_grad_enabled_calls(x):
    torch.set_grad_enabled(False)
    y = x * 2
    print("", end="")
    torch.set_grad_enabled(True)
    return y, x * 3


def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
    return a, b


def inference_mode_block(x):
    with torch.inference_mode():
        y = x * 2
    return y, x * 3


GRAPHS = {break_inside_no_grad: 2, break_inside_enable_grad: 2, break_inside_nested_blocks: 2,
          break_inside_set_grad_enabled_block: 2, break_between_set_grad_enabled_calls: 2,
          enable_grad_inside_no_grad: 1, inference_mode_block: 1}


def _run(fn, backend, outer):
    x_eager = torch.randn(3, requires_grad=True)
    x_kiln = x_eager.detach().clone().requires_grad_()
    compiled = kiln.compile(fn, backend=backend)
    with torch.set_grad_enabled(outer):
        expected, mode_eager = fn(x_eager), torch.is_grad_enabled()
    with torch.set_grad_enabled(outer):
        got, mode_kiln = compiled(x_kiln), torch.is_grad_enabled()
    assert mode_kiln == mode_eager
    assert [o.requires_grad for o in got] == [o.requires_grad for o in expected]
    for e, k in zip(expected, got):
        torch.testing.assert_close(k.detach(), e.detach())
    loss_e = [o.sum() for o in expected if o.requires_grad]
    loss_k = [o.sum() for o in got if o.requires_grad]
    if loss_e:
        sum(loss_e).backward()
        sum(loss_k).backward()
        torch.testing.assert_close(x_kiln.grad, x_eager.grad)
    return compiled


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("outer", [True, False], ids=["grad on", "grad off"])
@pytest.mark.parametrize("fn", list(GRAPHS), ids=lambda f: f.__name__)
def test_grad_mode_across_breaks(fn, outer, backend):
    compiled = _run(fn, backend, outer)
    if fn is not inference_mode_block:  # kiln runs the inference_mode frame eagerly: 0 graphs
        assert graph_count(context_of(compiled)) == GRAPHS[fn]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", list(GRAPHS), ids=lambda f: f.__name__)
def test_one_compiled_function_called_under_either_grad_mode(fn, backend):
    """The continuation inside the block restores the caller's grad mode on leaving it: its entry is guarded on
    that mode (the first call's, written as a constant, was restored after a call made with the other)."""
    compiled = kiln.compile(fn, backend=backend)
    x = torch.randn(3, requires_grad=True)
    for outer in (True, False, True, False):
        with torch.set_grad_enabled(outer):
            expected, mode_eager = fn(x), torch.is_grad_enabled()
        with torch.set_grad_enabled(outer):
            got, mode_kiln = compiled(x), torch.is_grad_enabled()
        assert mode_kiln == mode_eager
        assert [o.requires_grad for o in got] == [o.requires_grad for o in expected]


@pytest.mark.parametrize("fn", [break_inside_no_grad, enable_grad_inside_no_grad], ids=lambda f: f.__name__)
def test_grad_mode_across_breaks_with_the_default_backend(fn):
    _run(fn, "inductor", True)
    _run(fn, "inductor", False)


def _raise_after_break_in_no_grad(x):
    with torch.no_grad():
        print("", end="")
        return x[x.long() * 0 + 9]  # the continuation's graph raises IndexError


def _python_error_after_break_in_no_grad(x):
    with torch.no_grad():
        print("", end="")
        return {"a": x}["missing"]


def _breaking_call_raises_in_no_grad(x):
    def noisy(t):
        print("", end="")
        raise ValueError("from a call that breaks")

    with torch.no_grad():
        return noisy(x)


def _raise_in_enable_grad_inside_no_grad(x):
    with torch.no_grad():
        with torch.enable_grad():
            print("", end="")
            y = x * 2
            raise KeyError(y.shape[0])


def _raise_in_set_grad_enabled_block(x):
    with torch.set_grad_enabled(False):
        print("", end="")
        return x.long() // (x.long() * 0)


RAISING_IN_GRAD_MODE_BLOCKS = [_raise_after_break_in_no_grad, _python_error_after_break_in_no_grad,
                               _breaking_call_raises_in_no_grad, _raise_in_enable_grad_inside_no_grad,
                               _raise_in_set_grad_enabled_block]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("fn", RAISING_IN_GRAD_MODE_BLOCKS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("entry_grad", [True, False])
def test_an_exception_after_a_break_inside_a_grad_mode_block_restores_grad_mode(fn, entry_grad, backend):
    """The continuation resumes inside the block; an exception out of it leaves the block, as `with` does."""
    x = torch.arange(1.0, 4.0, requires_grad=True)
    outcomes = []
    for run in (fn, kiln.compile(fn, backend=backend)):
        with torch.set_grad_enabled(entry_grad):
            with pytest.raises(Exception) as info:
                run(x)
            outcomes.append((type(info.value), str(info.value), torch.is_grad_enabled()))
    assert outcomes[0] == outcomes[1] and outcomes[0][2] is entry_grad
