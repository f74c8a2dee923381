"""Outputs whose elements share memory (expanded outputs): the backward receives their gradients, which no
tensor with the output's strides can hold. kiln traces such a backward with contiguous gradients; eager's
backward runs and so must kiln's, with eager's gradients. Eager and kiln side by side.
"""
import pytest
import torch

from support.differential import check


def expand_a_reshaped_copy(a):
    t = a.t().reshape(-1)  # a copy: the graph computes it, then returns it expanded
    return t.unsqueeze(0).expand(2, *t.shape)


def expand_a_product_and_sine(a):
    return (a * 2).unsqueeze(1).expand(3, 4, 2), a.sin()


def expand_a_column(a):
    return (a + 1)[:, :1].expand(3, 5)


PROGRAMS = [expand_a_reshaped_copy, expand_a_product_and_sine, expand_a_column]


def make(call):
    return [torch.linspace(-1.0, 1.0, 6).reshape(3, 2).requires_grad_()]


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_backward_through_an_expanded_output(program, backend):
    check(program, make, backend, calls=2)
