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


@pytest.mark.sampled(every=2, classes=("fn",))
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


# Outputs on one storage, a detached one listed before one with history: the history must survive (the
# shared storage is rebuilt from a base, which must be the one with history, not the detached alias).
def detached_first(x):
    y = x * 2
    return y.detach(), y


def detached_slice_first(x):
    y = x + 1
    return y.detach()[::2], y[1:], y


def made_a_leaf_of_a_detached_alias(x):
    y = x * 3
    d = y.detach()
    d.requires_grad_()  # a new leaf on y's storage; y keeps its history
    return d, y


def requires_grad_on_an_unreturned_alias(x):
    y = x.sin()
    y.detach().requires_grad_()
    return y


@pytest.mark.sampled(every=2, classes=("fn",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", [detached_first, detached_slice_first, made_a_leaf_of_a_detached_alias,
                                requires_grad_on_an_unreturned_alias], ids=lambda f: f.__name__)
def test_outputs_with_history_beside_detached_aliases(fn, backend):
    x_eager = torch.randn(6, requires_grad=True)
    x_kiln = x_eager.detach().clone().requires_grad_(True)
    expected, actual = fn(x_eager), kiln.compile(fn, backend=backend)(x_kiln)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = actual if isinstance(actual, tuple) else (actual,)
    for e, a in zip(expected, actual):
        assert (a.requires_grad, a.grad_fn is None, a.is_leaf) == (e.requires_grad, e.grad_fn is None, e.is_leaf)
        torch.testing.assert_close(a, e)
    loss = sum((t * torch.arange(t.numel())).sum() for t in expected if t.grad_fn is not None)
    loss.backward()
    sum((t * torch.arange(t.numel())).sum() for t in actual if t.grad_fn is not None).backward()
    torch.testing.assert_close(x_kiln.grad, x_eager.grad)


# The same without any input that requires grad (the inference graph): the outputs on one storage are rebuilt
# on one of them; an output that is no view in eager must not become a view of the other, or making the other
# require grad after the call (`d.requires_grad_()`, a graph break) makes it require grad too.
def leaf_made_of_a_detached_alias_then_used(x):
    y = x * x
    d = y.detach().requires_grad_()
    return x @ y, d * 2


def detached_alias_made_a_leaf_then_returned(x):
    y = x + 1
    d = y.detach()
    d.requires_grad_()
    return y, d


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", [leaf_made_of_a_detached_alias_then_used, detached_alias_made_a_leaf_then_returned],
                         ids=lambda f: f.__name__)
def test_alias_made_a_leaf_leaves_its_base_alone(fn, backend):
    x = torch.randn(3, 3, dtype=torch.float64)
    expected, actual = fn(x), kiln.compile(fn, backend=backend)(x)
    for e, a in zip(expected, actual):
        assert (a.requires_grad, a.is_leaf, a._is_view()) == (e.requires_grad, e.is_leaf, e._is_view())
        torch.testing.assert_close(a, e)


# Graphs with no output to differentiate whose grad mode changes inside (a no_grad block, then ops under grad
# mode) and that call an op refusing an argument that requires grad (batch norm's running statistics): the
# analysis run must not make those arguments require grad (the backend failed with "not differentiable with
# respect to argument 'running_mean'").
torch.manual_seed(0)
EVAL_NORM = torch.nn.Sequential(torch.nn.Linear(3, 3, bias=False), torch.nn.BatchNorm1d(3)).eval()
TRAIN_NORM = torch.nn.BatchNorm1d(3)


def eval_norm_after_no_grad(x):
    with torch.no_grad():
        t = x * 2
    EVAL_NORM(t)


def eval_norm_detached(x):
    with torch.no_grad():
        t = x + 1
    return EVAL_NORM(t).detach()


def functional_norm_updating_statistics(x):
    with torch.no_grad():
        t = x * 3
    mean, var = torch.zeros(3), torch.ones(3)
    torch.nn.functional.batch_norm(t, mean, var, training=True)
    return mean, var


SYMFLOAT_SCALE = pytest.mark.allows_fallback("graph: the running variance's n / (n - 1) under dynamic sizes is a "
                                             "SymFloat division the C++ target cannot lower")


@pytest.mark.parametrize("fn,backend,dynamic", [
    pytest.param(fn, backend, dynamic, marks=[SYMFLOAT_SCALE] if (fn, backend, dynamic) == (
        functional_norm_updating_statistics, "inductor", True) else [], id=f"{fn.__name__}-{backend}-{dynamic}")
    for fn in (eval_norm_after_no_grad, eval_norm_detached, functional_norm_updating_statistics)
    for backend in ("aot_eager", "inductor") for dynamic in (None, True)])
def test_norm_statistics_after_a_no_grad_block(fn, backend, dynamic):
    x = torch.linspace(-1.0, 2.0, 15).reshape(5, 3)
    torch.testing.assert_close(kiln.compile(fn, backend=backend, dynamic=dynamic)(x), fn(x))
