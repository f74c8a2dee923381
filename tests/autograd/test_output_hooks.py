"""Tensor hooks on outputs of a compiled region, registered by user code after it (a graph break).

A compiled graph with several differentiable outputs is one backward node: autograd runs it when any output
gets a gradient and then calls the hooks of every output, with None for those the loss does not reach.
Eager never calls the hook of a tensor the loss does not reach; kiln must not either, and hooks of reached
outputs must run (and change the gradient) as eager's do.
"""
import pytest
import torch

import kiln


def hooks_on_two_outputs(a, b, log):
    used = b + a
    unused = a * 1.5
    unused.register_hook(lambda g: log.append(("unused", tuple(g.shape))))  # a graph break in kiln
    used.register_hook(lambda g: log.append(("used", tuple(g.shape))))
    return used.sum()


def scaling_hook_on_a_reached_output(a, b, log):
    x = a * b
    y = a.sin()
    x.register_hook(lambda g: g * 3)
    y.register_hook(lambda g: log.append(g.sum().item()))
    return x.sum()


def removed_hook(a, b, log):
    x = a * 2
    y = b * a
    handle = y.register_hook(lambda g: log.append("removed"))
    handle.remove()
    x.register_hook(lambda g: log.append("kept"))
    return (x + y).sum()


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [hooks_on_two_outputs, scaling_hook_on_a_reached_output, removed_hook],
                         ids=lambda f: f.__name__)
def test_hooks_run_only_on_gradients(program, backend):
    def run(fn):
        a = torch.linspace(-1.0, 1.0, 6).reshape(2, 3).requires_grad_(True)
        b = torch.linspace(0.5, 1.5, 6).reshape(2, 3)
        log = []
        fn(a, b, log).backward()
        return a.grad, log

    expected_grad, expected_log = run(program)
    actual_grad, actual_log = run(kiln.compile(program, backend=backend))
    assert actual_log == expected_log
    torch.testing.assert_close(actual_grad, expected_grad)
