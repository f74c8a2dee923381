"""In-place changes of a tensor's autograd flags (`requires_grad_`, `detach_`) inside compiled code.

They have no ATen op, so no compiled graph can make them: one that changes the flags ends the graph
and runs as eager's does (torch.compile breaks on it too); one that leaves them as they are returns
the tensor itself, in the graph. Eager and kiln side by side on every backend: the outputs, which
output is which input, and each input's and output's requires_grad / is_leaf afterwards.
"""
import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import break_reasons

BACKENDS = ["eager", "aot_eager", "inductor"]


def detach_input(x):
    y = x.detach_()
    return y, y * 2


def stop_requiring_grad(x):
    x.requires_grad_(False)
    return x * 2, x


def start_requiring_grad(x):
    x.requires_grad_()
    return x * 2


def toggle_intermediate(x):
    y = x.detach()
    y.requires_grad_(True)
    return y * 2, y


def unchanged_flags(x, w):
    w.requires_grad_(True)
    return x.detach_() * w, w


def _flags(t: torch.Tensor) -> tuple:
    return t.requires_grad, t.is_leaf, t.grad_fn is None


def _run(fn, make):
    args = make()
    out = fn(*args)
    return args, out if isinstance(out, tuple) else (out,)


def _compare(fn, make, backend):
    compiled = kiln.compile(fn, backend=backend)
    for _ in range(2):
        (e_args, e_out), (k_args, k_out) = _run(fn, make), _run(compiled, make)
        for e, k in zip(e_out, k_out):
            torch.testing.assert_close(k.detach(), e.detach())
        assert [_flags(t) for t in k_out + k_args] == [_flags(t) for t in e_out + e_args]
        assert [[o is a for a in k_args] for o in k_out] == [[o is a for a in e_args] for o in e_out]
    return context_of(compiled)


def _non_leaf():
    return (torch.linspace(-1.0, 1.0, 6, requires_grad=True) * 1,)


def _leaf(requires_grad):
    return lambda: (torch.linspace(-1.0, 1.0, 6, requires_grad=requires_grad),)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn, make", [(detach_input, _non_leaf), (stop_requiring_grad, _leaf(True)),
                                      (start_requiring_grad, _leaf(False)), (toggle_intermediate, _leaf(False))],
                         ids=["detach_input", "stop_requiring_grad", "start_requiring_grad", "toggle_intermediate"])
def test_a_change_of_autograd_flags_runs_as_in_eager(fn, make, backend):
    ctx = _compare(fn, make, backend)
    assert "autograd_flags" in break_reasons(ctx)


@pytest.mark.parametrize("backend", BACKENDS)
def test_flags_left_as_they_are_stay_in_the_graph(backend):
    ctx = _compare(unchanged_flags, lambda: (torch.linspace(-1.0, 1.0, 6), torch.ones(6, requires_grad=True)), backend)
    assert break_reasons(ctx) == []


def test_a_gradient_reaches_a_tensor_made_to_require_grad_inside():
    grads = []
    for fn in (toggle_intermediate, kiln.compile(toggle_intermediate, backend="aot_eager")):
        out, y = fn(torch.linspace(-1.0, 1.0, 6))
        out.sum().backward()
        grads.append(y.grad)
    torch.testing.assert_close(grads[1], grads[0])
