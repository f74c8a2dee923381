"""In-place view ops on graph inputs (`t_`, `transpose_`, `unsqueeze_`, `squeeze_`, `as_strided_`) change the
input's geometry, not its data: functionalization keeps the data flow in the graph, and the runtime gives the
input its new geometry after the call (as AOTAutograd does). Eager and kiln side by side: outputs, and each
input's shape, strides and values after the call.
"""
import pytest
import torch

import kiln


def transpose_in_place(a, b):
    t = b.t_()
    return b * t, a + 1


def unsqueeze_then_write(a, b):
    b.unsqueeze_(0)
    b[:, ::2] = 0
    return b * 2


def squeeze_and_add(a, b):
    a.squeeze_()
    a.add_(1)
    return a.sum()


def as_strided_in_place(a, b):
    b.as_strided_((b.numel() // 2,), (2,))
    return b + a.sum()


def returns_the_input(a, b):
    b.transpose_(0, 1)
    return [b, a.sum(0)]


def intermediate_and_input(a, b):
    c = a * 2
    c.t_()
    b.t_()
    return c + b.sum()


PROGRAMS = [transpose_in_place, unsqueeze_then_write, squeeze_and_add, as_strided_in_place, returns_the_input,
            intermediate_and_input]


def make():
    return torch.linspace(-1.0, 1.0, 6).reshape(1, 6)[:, :4].reshape(2, 2), torch.arange(6.0).reshape(2, 3)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_in_place_view_op_on_an_input(program, backend):
    compiled = kiln.compile(program, backend=backend)
    for _ in range(2):
        eager_args, kiln_args = make(), make()
        expected, actual = program(*eager_args), compiled(*kiln_args)
        torch.testing.assert_close(actual, expected)
        for e, k in zip(eager_args, kiln_args):
            assert (k.shape, k.stride(), k.storage_offset()) == (e.shape, e.stride(), e.storage_offset())
            torch.testing.assert_close(k, e)
        if isinstance(expected, list):
            assert actual[0] is kiln_args[1]
