"""A graph input that the graph reads, then writes in place, where eager's backward saved a value computed
from it (`c.float()`), not the input. The partitioner may save the input instead (it is as large, and the
cast fuses into the backward's kernel); the runtime writes the input once the forward ran, so the saved
value must be the one the graph read: eager's backward runs, and so must kiln's, with eager's gradients.
Eager and kiln side by side (values, gradients, inputs after the call).
"""
import pytest
import torch

from support.differential import check


def atan2_of_cast_then_add(b, c):
    t = torch.atan2(b, c.float())
    c.add_(1)
    return t.abs()


def product_with_cast_then_scale(b, c):
    t = (b * c.float()).sin()
    c.mul_(3)
    return t


def divide_by_shifted_then_zero(b, c):
    t = b / (c.float() + 10)
    c.zero_()
    return t.exp()


def ratio_then_transpose_write(b, c):
    t = torch.atan2(c.float(), b)
    c.t_()
    c.add_(2)
    return t


PROGRAMS = [atan2_of_cast_then_add, product_with_cast_then_scale, divide_by_shifted_then_zero,
            ratio_then_transpose_write]


def make(call):
    n = 4 + call
    b = torch.linspace(-1.0, 2.0, n * n).reshape(n, n).requires_grad_()
    return [b, torch.arange(n * n, dtype=torch.int32).reshape(n, n) % 5 - 2]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_backward_reads_the_value_the_graph_read(program, backend):
    check(program, make, backend, calls=2)
