"""An integer tensor written in place with a value that requires grad (`c[...] = b`) requires grad in eager,
though autograd has no gradient of its dtype: eager raises ("Autograd not support dtype") only when autograd
is asked to go through it (a view of it, a backward). kiln must give it the same state, and raise the same
error where eager does, never fail the compile. Eager and kiln side by side.
"""
import pytest
import torch

import kiln
from support.differential import compare_results


def write_then_view(b, c):
    c[...] = b
    t = torch.relu(b)
    c[:2]
    return [t.sin(), t]


def write_and_return(b, c):
    c[...] = b
    return c, b * 2


def write_a_row(b, c):
    c[0] = b * 3
    return b.exp()


def write_then_add(b, c):
    c.copy_(b.expand(c.shape))
    return c + 1


PROGRAMS = [write_then_view, write_and_return, write_a_row, write_then_add]


def make():
    return [torch.tensor(1.5, requires_grad=True), torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)]


def outcome(fn, args):
    try:
        return fn(*args), None
    except RuntimeError as e:
        return None, (type(e), str(e))


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_integer_tensor_requiring_grad(program, backend):
    compiled = kiln.compile(program, backend=backend)
    for call in range(2):
        e_args, k_args = make(), make()
        (expected, e_error), (actual, k_error) = outcome(program, e_args), outcome(compiled, k_args)
        assert k_error == e_error
        assert [a.requires_grad for a in k_args] == [a.requires_grad for a in e_args]
        if e_error is None:  # the backward starts from the float outputs (eager's own fails through an integer)
            floats = [k for k, t in enumerate(torch.utils._pytree.tree_leaves(expected)) if t.is_floating_point()]
            compare_results(e_args, expected, k_args, actual, f"{backend}, call {call}", loss_from=floats)
