"""Writes into inputs whose elements share memory (expanded, broadcast, overlapping `as_strided` windows).

`a = row.expand(3, 2)` holds one row of memory: `a[0] = 1` writes that row, and every row of `a` reads it
after. Eager allows a write whose written view has no overlap of its own (`a[0]`, `a[:, 1:]`,
`a.diagonal()`) and raises where it has (`a.add_(1)`, `a.t()[1].mul_(2)`). kiln compiles the first kind
(the input becomes a view of a base holding its memory, aliased_inputs.py, and the write one `as_strided`
view of that base, functionalize.py) and raises eager's error for the second. Eager also allows an empty write
(`a[:, 3:] = 0`) and a fill (`a.fill_(1)`, `a.zero_()`) whatever the overlap, and writes overlapping windows in
its kernel's order. Eager and kiln side by side.
"""
import pytest
import torch

import kiln
from support.differential import check

BACKENDS = ["aot_eager", "inductor"]


def fill_a_row(a):
    a[0] = 1.0
    return a * 2


def add_into_a_row(a, x):
    a[1].add_(x)
    return a.sum(0)


def copy_into_a_row(a, x):
    a[0].copy_(x * 3)
    return a + x


def index_put_into_a_row(a):
    a[0, [1]] = 9.0
    return a.clone()


def write_a_corner(a):
    a[:1, 1:].mul_(-1)  # slices of slices: the first row's last columns, no overlap within the written view
    return a + 0


def write_the_diagonal(a):
    a.diagonal().mul_(3)
    return a.cumsum(0)


def write_a_row_through_unsqueeze(a):
    a[0].unsqueeze(0).sub_(0.5)
    return a.max(0).values


def write_then_return_views(a):
    a[2] = a[2] + 1
    return a, a[1], a.t()


WRITES = [fill_a_row, add_into_a_row, copy_into_a_row, index_put_into_a_row, write_a_corner,
          write_the_diagonal, write_a_row_through_unsqueeze, write_then_return_views]


def expanded(call):
    return torch.linspace(-1.0, 2.0, 2 + call).reshape(1, -1).expand(3, 2 + call)


def broadcast(call):
    return torch.linspace(-1.0, 2.0, 2 + call).expand(3, 2 + call)


def windows(call):
    """Overlapping rows: row i is elements i .. i+n-1 of one vector."""
    n = 2 + call
    return torch.linspace(-1.0, 2.0, 3 + n).as_strided((3, n), (1, 1))


LAYOUTS = {"expanded": expanded, "broadcast": broadcast, "windows": windows}


def _arguments(program, layout):
    def make(call):
        a = LAYOUTS[layout](call)
        return [a, torch.linspace(0.5, 1.5, a.shape[1])] if program.__code__.co_argcount == 2 else [a]
    return make


@pytest.mark.sampled(every=2, classes=("program", "layout"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("program", WRITES, ids=lambda f: f.__name__)
def test_write_into_a_view_of_an_overlapping_input(program, layout, backend):
    check(program, _arguments(program, layout), backend, calls=2)


def add_into_all(a):
    a.add_(1)
    return a


def mul_a_transposed_row(a):
    a.t()[1].mul_(2)
    return a


def negate_columns_of_every_row(a):
    a[:, 1:].mul_(-1)  # every row's columns: the rows share them
    return a


def copy_into_an_expanded_row(a):
    a[0][None].expand(2, -1).copy_(torch.ones(2, a.shape[1]))
    return a


RAISING = [add_into_all, mul_a_transposed_row, negate_columns_of_every_row, copy_into_an_expanded_row]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", RAISING, ids=lambda f: f.__name__)
def test_write_whose_view_overlaps_raises_as_eager(program, backend):
    with pytest.raises(RuntimeError) as eager:
        program(expanded(0))
    with pytest.raises(type(eager.value), match="single memory location"):
        kiln.compile(program, backend=backend)(expanded(0))


def write_a_row_of_two_aliased_inputs(a, b):
    a[0] = True
    return b.sum(0, dtype=torch.float64), a.clone()


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_into_an_expanded_input_aliased_by_another(backend):
    """Fuzz seed 100241: `b = a[::2]` of an expanded bool `a`; `a[0] = 1` is read through `b`."""
    def make(call):
        a = (torch.arange(2) % 2 == 0).reshape(1, 2).expand(3, 2)
        return [a, a[::2]]
    check(write_a_row_of_two_aliased_inputs, make, backend, calls=2)


def write_a_row_then_square(w, a):
    a[0].mul_(2)
    return a * a


def write_a_row_then_return_views(w, a):
    a[0].mul_(2)
    return a[1:], a.t()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [write_a_row_then_square, write_a_row_then_return_views],
                         ids=lambda f: f.__name__)
def test_write_into_an_expanded_input_that_requires_grad(program, backend):
    """The expanded input is a view of a tensor requiring grad (not a leaf, input 0): the write and the
    gradient reach it."""
    def make(call):
        w = torch.linspace(-1.0, 2.0, 2).reshape(1, 2).requires_grad_()
        return [w, (w * 1).expand(3, 2)]
    check(program, make, backend)


def write_a_row_of_a_leaf(a):
    a[0].mul_(2)
    return a


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_into_an_expanded_leaf_that_requires_grad_raises_as_eager(backend):
    def make():
        return torch.linspace(-1.0, 2.0, 2).reshape(1, 2).expand(3, 2).requires_grad_()
    with pytest.raises(RuntimeError) as eager:
        write_a_row_of_a_leaf(make())
    with pytest.raises(type(eager.value), match="leaf Variable that requires grad"):
        kiln.compile(write_a_row_of_a_leaf, backend=backend)(make())


def write_through_an_expanded_intermediate(x, v):
    y = x * 1
    y.expand(3, *y.shape)[1].copy_(v)
    return y


def write_through_an_expanded_input(x, v):
    x.expand(3, *x.shape)[1].copy_(v)
    return x + 0


def assign_through_an_expanded_input(x, v):
    x.expand(2, 3, *x.shape)[1, 2] = v
    return x.clone()


@pytest.mark.sampled(every=2, classes=("dynamic", "program"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [write_through_an_expanded_intermediate, write_through_an_expanded_input,
                                     assign_through_an_expanded_input], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dynamic", [None, True], ids=["static", "dynamic"])
def test_write_of_infinities_through_an_expanded_view(program, backend, dynamic):
    """The written values replace the old ones exactly: inf over a finite value, a finite one over inf (with
    symbolic sizes, such a graph compiles per shape)."""
    def make(call):
        x, v = torch.full((3 + call,), -2.0), torch.full((3 + call,), 3.0)
        x[1], v[0], v[2] = float("inf"), float("inf"), float("nan")
        return [x, v]
    check(program, make, backend, calls=2, dynamic=dynamic)


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [fill_a_row, add_into_a_row, write_then_return_views], ids=lambda f: f.__name__)
def test_write_into_a_view_of_an_overlapping_input_dynamic(program, backend):
    """Sizes that change between calls, compiled as symbols: each shape's base and views are its own."""
    check(program, _arguments(program, "expanded"), backend, calls=3, dynamic=True)


# -- writes eager allows into a view whose elements share memory: empty ones, and fills ---------------------------

def assign_an_empty_slice(a):
    a[..., a.shape[-1]:] = 0  # no element: eager writes nothing (fuzz seed 200565)
    return a.clone()


def add_into_no_rows(a):
    a[:0].add_(1)
    return a * 2


def copy_into_an_empty_column_range(a):
    a[:, 1:1].copy_(torch.ones(a.shape[0], 0))
    return a.sum(1)


def fill_all(a):
    a.fill_(-3.0)
    return a.clone()


def zero_all_then_read(a):
    a.zero_()
    return a + 1


def fill_a_column(a):
    a[:, 0].fill_(7.0)  # every row's first element: one memory location per column of the expanded input
    return a.t().clone()


def init_zeros_of_a_slice(a):
    torch.nn.init.zeros_(a[1:])
    return a.mean(0)


def fill_no_rows(a):
    a[3:].fill_(5.0)  # no row: the cut of its repeated dimension must not give it one
    return a.clone()


ALLOWED = [assign_an_empty_slice, add_into_no_rows, copy_into_an_empty_column_range, fill_all, zero_all_then_read,
           fill_a_column, init_zeros_of_a_slice, fill_no_rows]


@pytest.mark.sampled(every=2, classes=("program", "layout"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("program", ALLOWED, ids=lambda f: f.__name__)
def test_empty_writes_and_fills_of_an_overlapping_input(program, layout, backend):
    """Eager writes nothing for an empty region and one value everywhere for a fill, whatever the overlap; the
    compiled graph does the same, with no fallback (strict)."""
    check(program, _arguments(program, layout), backend, calls=2)


def column_of_ones(call):
    """A column repeated along the rows (stride 0 in the last dimension), as an `(n, 1)` input expanded."""
    return torch.linspace(-1.0, 2.0, 2 + call).reshape(-1, 1).expand(2 + call, 3)


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [assign_an_empty_slice, fill_all, zero_all_then_read],
                         ids=lambda f: f.__name__)
def test_empty_writes_and_fills_with_sizes_that_change(program, backend):
    check(program, lambda call: [column_of_ones(call)], backend, calls=3, dynamic=True)


def fill_the_expanded_one(a, b):
    b.fill_(2.0)  # b expands a: a's memory, each element once
    return a + 0, b.clone()


def assign_nothing_into_the_expanded_one(a, b):
    b[:, 5:] = 1.0
    return a * 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [fill_the_expanded_one, assign_nothing_into_the_expanded_one],
                         ids=lambda f: f.__name__)
def test_writes_into_an_input_expanding_another(program, backend):
    def make(call):
        a = torch.linspace(-1.0, 2.0, 3 + call)
        return [a, a.expand(2, -1)]
    check(program, make, backend, calls=2)


def add_into_windows(a):
    a.add_(1)  # rows are overlapping windows: eager's kernel adds once per element sharing the memory
    return a.clone()


def scale_windows(a):
    a.mul_(2)
    return a.sum(0)


def copy_rows_into_windows(a):
    a[torch.tensor([0, 1])] = torch.arange(2 * a.shape[1], dtype=a.dtype).reshape(2, -1)
    return a.clone()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [add_into_windows, scale_windows, copy_rows_into_windows],
                         ids=lambda f: f.__name__)
def test_writes_in_the_order_of_eagers_kernel(program, backend):
    """ATen does not check windows that overlap (`as_strided((3, n), (1, 1))`): eager's kernel writes them, each
    element reading what the elements before it wrote, which no functional graph computes. kiln runs such a graph
    op by op (a slow path, not a fallback), with eager's values."""
    check(program, _arguments(program, "windows"), backend, calls=2)


def fill_an_expanded_view_of_an_input(a):
    a.unsqueeze(-1).expand(*a.shape, 3).fill_(7)
    return a * 2


def zero_columns_of_an_expanded_view_of_an_input(a):
    a.unsqueeze(-1).expand(*a.shape, 3)[:, 1:].zero_()
    return a + 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32], ids=str)
@pytest.mark.parametrize("program", [fill_an_expanded_view_of_an_input, zero_columns_of_an_expanded_view_of_an_input],
                         ids=lambda f: f.__name__)
def test_a_fill_through_an_expanded_view_of_an_input(program, dtype, backend):
    """Fuzz seed 407588: the fill itself is into the view with overlap (traced as a fill of its memory seen once, a
    view of that view), which the search for writes through overlap missed; functionalization then refused the
    write."""
    check(program, lambda call: [torch.arange(12 + 3 * call).reshape(-1, 3).to(dtype)], backend, calls=2)


def scale_then_copy_through_an_expanded_input(x, v):
    x.mul_(2)
    x.expand(3, *x.shape)[1].copy_(v)
    return x + 0


def copy_through_an_expanded_in_place_result(x, v):
    x.add_(1).expand(2, *x.shape)[0, 1:].copy_(v[1:])
    return x * 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("program", [scale_then_copy_through_an_expanded_input,
                                     copy_through_an_expanded_in_place_result], ids=lambda f: f.__name__)
def test_a_write_through_an_expanded_view_of_an_input_written_before(program, backend):
    """The expanded view is taken of the input as an in-place op returned it: the write is still one `as_strided`
    view of the input's base (its chain of views goes on through the in-place op), which functionalization
    refused as a second `as_strided` when the chain stopped there."""
    check(program, lambda call: [torch.linspace(1.0, 2.0, 4 + call), torch.linspace(5.0, 6.0, 4 + call)], backend,
          calls=2)
