"""In-place view ops on graph inputs (`t_`, `transpose_`, `unsqueeze_`, `squeeze_`, `as_strided_`) change the
input's geometry, not its data: functionalization keeps the data flow in the graph, and the runtime gives the
input its new geometry after the call (as AOTAutograd does). Eager and kiln side by side: outputs, and each
input's shape, strides and values after the call.
"""
import logging

import pytest
import torch

import kiln
from support.differential import check


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


def write_then_transpose(a, b):
    """Fuzz seed 407272: the input reaches `t_` as the result of an in-place op on it. Made out of place as a view of
    a tensor the graph made, the value written back was the one before `t_`: transposed into the square input (a
    silent wrong answer), or a size mismatch."""
    a.mul_(3)
    a.t_()
    b.fill_(1)
    b.t_()
    return a.sum(0)


def chained_write_then_transpose(a, b):
    a.add_(1).t_()
    return b + 0


def unsqueeze_then_copy_itself(a, b):
    """Fuzz seed 95825: the input's write with its own elements left the graph returning the input itself, viewed
    (strides `(0, 1)`), as its new value, and copying that view back into the input raised ATen's overlap error."""
    t = b.unsqueeze_(0)
    t.copy_(t)
    return t * 2, a + 1


PROGRAMS = [unsqueeze_then_copy_itself, transpose_in_place, unsqueeze_then_write, squeeze_and_add,
            as_strided_in_place, returns_the_input, intermediate_and_input, write_then_transpose,
            chained_write_then_transpose]


def make():
    return torch.linspace(-1.0, 1.0, 6).reshape(1, 6)[:, :4].reshape(2, 2), torch.arange(6.0).reshape(2, 3)


@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [write_then_transpose, chained_write_then_transpose, unsqueeze_then_copy_itself],
                         ids=lambda f: f.__name__)
def test_a_written_input_transposed_in_place_holds_eagers_values(program, backend, grad_mode):
    """The inputs (and their values after the call) as eager's, with an input that requires grad too."""
    def arguments(call):
        a, b = make()
        return a.requires_grad_() * 1 if grad_mode else a, b

    check(program, arguments, backend, calls=2, grad_mode=grad_mode)


@pytest.mark.sampled(every=2, classes=("program",))
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


# -- on inputs that share storage: the graph writes through one base per storage (aliased_inputs.py), and the
# in-place view op must still change the inputs themselves; one tensor passed twice changes through both names.

def transpose_then_read_the_other(a, b):
    a.t_()
    return b + 1, a * 2


def unsqueeze_then_write_the_other(a, b):
    a.unsqueeze_(0)
    a.add_(1)
    return b * 1


def transpose_the_returned_one(a, b):
    b.transpose_(0, 1)
    return b, a.sum(0)


def as_strided_then_read(a, b):
    b.as_strided_((2,), (2,))
    return a + b.sum()


SHARED = {
    "same": lambda x: (x, x),
    "stepped": lambda x: (x, x[::2]),
    "transposed": lambda x: (x, x.t()),
}


@pytest.mark.sampled(every=2, classes=("program", "sharing"))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("sharing", list(SHARED))
@pytest.mark.parametrize("program", [transpose_then_read_the_other, unsqueeze_then_write_the_other,
                                     transpose_the_returned_one, as_strided_then_read], ids=lambda f: f.__name__)
def test_in_place_view_op_on_inputs_sharing_storage(program, sharing, backend):
    compiled = kiln.compile(program, backend=backend)
    for call in range(2):
        eager_args, kiln_args = (SHARED[sharing](torch.arange(12.0).reshape(4, 3) + call) for _ in range(2))
        expected, actual = program(*eager_args), compiled(*kiln_args)
        torch.testing.assert_close(actual, expected)
        for e, k in zip(eager_args, kiln_args):
            assert (k.shape, k.stride(), k.storage_offset()) == (e.shape, e.stride(), e.storage_offset())
            torch.testing.assert_close(k, e)
        if program is transpose_the_returned_one:
            assert actual[0] is kiln_args[1]


def unsqueeze_then_branch(a, b):
    t = b.unsqueeze_(0)
    if t.sum() > 0:  # a graph break: the next graph reads the input with its new geometry
        return t + 1
    return t - 1


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [transpose_in_place, unsqueeze_then_write, as_strided_in_place,
                                     unsqueeze_then_branch], ids=lambda f: f.__name__)
def test_in_place_view_op_on_an_input_at_a_storage_offset(program, backend):
    """`buf[1:]`: the input keeps its storage offset (the tensor guards do not pin it: `buf[2:]` passes too)."""
    compiled = kiln.compile(program, backend=backend, dynamic=False)
    for call in range(3):
        eager_args, kiln_args = [(torch.ones(2, 2), torch.arange(12.0)[call:call + 6].view(2, 3)) for _ in range(2)]
        expected, actual = program(*eager_args), compiled(*kiln_args)
        torch.testing.assert_close(actual, expected)
        for e, k in zip(eager_args, kiln_args):
            assert (k.shape, k.stride(), k.storage_offset()) == (e.shape, e.stride(), e.storage_offset())
            torch.testing.assert_close(k, e)


def resize_same(a, b):
    return b.resize_(b.shape) * 2, b


def resize_smaller(a, b):
    b.resize_(2, 2)
    return b + a


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [resize_same, resize_smaller], ids=lambda f: f.__name__)
def test_resize_of_an_input_that_does_not_grow_it(program, backend):
    """`resize_` refuses tensors that require grad: the AOT stage's fake run must not make the inputs so."""
    compiled = kiln.compile(program, backend=backend)
    for _call in range(2):
        eager_args, kiln_args = make(), make()
        expected, actual = program(*eager_args), compiled(*kiln_args)
        torch.testing.assert_close(actual, expected)
        for e, k in zip(eager_args, kiln_args):
            assert (k.shape, k.stride()) == (e.shape, e.stride())
            torch.testing.assert_close(k, e)


def unsqueeze_and_return(t, w):
    return t.unsqueeze_(0), w * 2


def transpose_then_use(t, w):
    t.t_()
    return t * w.t()


def write_then_transpose(t, w):
    t.mul_(2).t_()
    return t.sin(), t


def unsqueeze_against_a_weight(t, w):
    t.unsqueeze_(1)
    return t * w


GRAD_PROGRAMS = [unsqueeze_and_return, transpose_then_use, write_then_transpose, unsqueeze_against_a_weight]


def make_grad(call):
    """A non-leaf input that requires grad (eager lets an in-place view op change it), and a leaf weight."""
    leaf = torch.linspace(-1.0, 1.0, 6 + call).reshape(-1)[:6].reshape(3, 2).requires_grad_()
    return [leaf * 1.5, torch.linspace(0.5, 2.0, 6).reshape(3, 2).requires_grad_()]


def make_vector(call):
    return [torch.linspace(-1.0, 1.0, 3).requires_grad_() * 1.5, torch.linspace(0.5, 2.0, 12).reshape(3, 4)
            .requires_grad_()]


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", GRAD_PROGRAMS, ids=lambda f: f.__name__)
def test_in_place_view_op_on_an_input_that_requires_grad(program, backend, caplog):
    """The input takes the new geometry and a history through the compiled graph: values, gradients of the
    leaves behind it, and what a later write through it changes all match eager's. Compiled, not run op by op."""
    make = make_vector if program in (unsqueeze_and_return, unsqueeze_against_a_weight) else make_grad
    with caplog.at_level(logging.WARNING, logger="kiln.perf_hints"):
        check(program, make, backend, calls=2)
    assert not [r for r in caplog.records if "op by op" in r.getMessage()]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_in_place_view_op_on_a_leaf_that_requires_grad_raises_as_eager(backend):
    errors = []
    for fn in (unsqueeze_and_return, kiln.compile(unsqueeze_and_return, backend=backend)):
        t, w = torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)
        with pytest.raises(RuntimeError) as error:
            fn(t, w)
        errors.append((str(error.value), t.shape))
    assert errors[1] == errors[0]


def make_offset():
    """Inputs that view their storage from an offset (the restrided input keeps it, as eager's does)."""
    return torch.linspace(-1.0, 1.0, 5)[1:].reshape(2, 2), torch.arange(8.0)[2:].reshape(2, 3)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_in_place_view_op_on_an_input_at_an_offset(program, backend):
    check(program, lambda call: list(make_offset()), backend, calls=2, grad_mode=False)
