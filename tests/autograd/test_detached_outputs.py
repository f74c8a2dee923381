"""Outputs detached from every input that requires grad: no output to differentiate, so the inference
graph runs; its outputs must not require grad (functionalization drops the detach, so the graph must
not run under grad mode either)."""
import pytest
import torch

import kiln


def detach_then_scale(x):
    return x.detach() * 2


def detach_then_round(x):
    return x.detach().round()


def two_detached(x, y):
    return x.detach() + y.detach(), (x * 0).detach()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", [detach_then_scale, detach_then_round, two_detached], ids=lambda f: f.__name__)
def test_detached_outputs_do_not_require_grad(fn, backend):
    args = [torch.randn(4, requires_grad=True) for _ in range(fn.__code__.co_argcount)]
    expected, actual = fn(*args), kiln.compile(fn, backend=backend)(*args)
    flat_expected = expected if isinstance(expected, tuple) else (expected,)
    flat_actual = actual if isinstance(actual, tuple) else (actual,)
    for e, a in zip(flat_expected, flat_actual):
        assert a.requires_grad is e.requires_grad is False
        torch.testing.assert_close(a, e)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_view_of_an_input_keeps_its_history(backend):
    """No graph output to differentiate, but the returned view of `x` carries x's history, as in eager."""
    def view_and_detached(x):
        return x.view(2, 2), x.detach() * 3

    x = torch.randn(4, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    view, detached = kiln.compile(view_and_detached, backend=backend)(x)
    assert view.requires_grad and not detached.requires_grad
    (view * 5).sum().backward()
    (x_ref.view(2, 2) * 5).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
