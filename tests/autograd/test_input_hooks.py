"""Tensor hooks on inputs of a compiled graph that a backward does not reach.

A compiled graph with several differentiable outputs is one backward node: a backward through one output runs
it, and it gives None to the inputs only the other outputs reach. Autograd then calls those inputs' hooks with
None (and, through their history, the hooks of the leaves behind them), where eager's backward never reaches
them. kiln's hooks there run only on a gradient: registered before the call, inside the compiled function after
a graph break, on leaves or intermediates. Found by the fuzzer (seeds 110076, 410288: `b.register_hook(lambda g:
g.clamp(-1, 1))` raised AttributeError on None).
"""
import pytest
import torch

import kiln

BACKENDS = ["aot_eager", "inductor"]


def hook_after_a_break_on_an_unreached_leaf(a, b, log):
    kept = a.sin()
    dropped = a * b  # lives across the break, and no output reads it
    b.register_hook(lambda g: log.append("b") or g.clamp(-1, 1))  # a graph break in kiln
    dropped.sum()
    return kept * 2


def hook_on_a_leaf_behind_the_unreached_input_of_a_later_graph(a, b, log):
    doubled = b * 2  # the first graph's one output
    b.register_hook(lambda g: log.append("b") or g.clamp(-1, 1))
    kept = a.sin()
    dropped = doubled * a  # the second graph gives `doubled` None, which the first graph passes on to b
    return kept, dropped


def scaling_hook_on_a_reached_leaf(a, b, log):
    kept = a * b
    dropped = a.exp()
    b.register_hook(lambda g: log.append("b") or g * 3)
    return kept, dropped


PROGRAMS = [hook_after_a_break_on_an_unreached_leaf, hook_on_a_leaf_behind_the_unreached_input_of_a_later_graph,
            scaling_hook_on_a_reached_leaf]


def first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_hooks_registered_in_the_function_run_only_on_gradients(program, backend):
    def run(fn):
        a = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_(True)
        b = torch.linspace(0.5, 1.5, 6).reshape(2, 3).requires_grad_(True)
        log = []
        first(fn(a, b, log)).sum().backward()
        return (a.grad, b.grad), log

    (expected_grads, expected_log), (grads, log) = run(program), run(kiln.compile(program, backend=backend))
    assert log == expected_log
    torch.testing.assert_close(grads, expected_grads)


def two_outputs(a, b):
    return a.sin(), a * b


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("leaf", [True, False], ids=["leaf", "intermediate"])
def test_hooks_registered_before_the_call_run_only_on_gradients(leaf, backend):
    """Hooks the caller put on an input (a leaf, or an intermediate whose leaf gets no gradient either) before the
    call; removing one through its handle after the call still removes it."""
    def run(fn):
        a = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_(True)
        w = torch.linspace(0.5, 1.5, 6).reshape(2, 3).requires_grad_(True)
        b = w if leaf else w + 1  # eager's add saves nothing (test_saved_parts.py: a node that saves is freed)
        log = []
        b.register_hook(lambda g: log.append("kept") or g.clamp(-1, 1))
        removed = b.register_hook(lambda g: log.append("removed"))
        out, other = fn(a, b)
        removed.remove()
        out.sum().backward()
        other.sum().backward()  # reaches b: the kept hook runs, and changes w's gradient
        return (a.grad, w.grad), log

    (expected_grads, expected_log), (grads, log) = run(two_outputs), run(kiln.compile(two_outputs, backend=backend))
    assert log == expected_log
    torch.testing.assert_close(grads, expected_grads)


def post_accumulate_hook_after_a_break(a, b, log):
    kept = a.sin()
    dropped = a * b
    b.register_post_accumulate_grad_hook(lambda p: log.append(("after", p.grad.sum().item())))
    return kept, dropped


@pytest.mark.parametrize("backend", BACKENDS)
def test_post_accumulate_grad_hooks_run_only_after_a_gradient(backend):
    """Registered before the call and inside it: autograd calls them with the leaf, whose `.grad` is None where
    the backward gave it no gradient; eager's backward does not call them there."""
    def run(fn):
        a = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_(True)
        b = torch.linspace(0.5, 1.5, 6).reshape(2, 3).requires_grad_(True)
        log = []
        b.register_post_accumulate_grad_hook(lambda p: log.append(("before", p.grad.sum().item())))
        kept, dropped = fn(a, b, log)
        kept.sum().backward()
        dropped.sum().backward()
        return (a.grad, b.grad), log

    program = post_accumulate_hook_after_a_break
    (expected_grads, expected_log), (grads, log) = run(program), run(kiln.compile(program, backend=backend))
    assert log == expected_log
    torch.testing.assert_close(grads, expected_grads)
