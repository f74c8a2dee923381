"""Ops whose output size (or value in Python) depends on tensor data: nonzero, x[mask], unique, ...

kiln ends the graph before such an op, runs it natively and compiles the rest, as torch.compile does
by default (capture_dynamic_output_shape_ops off). Each case runs under the capture-only, aot_eager and
default backends, with and without requires_grad, on two inputs with different data; values and
gradients are compared with eager, and kiln's graph count with torch.compile's on the same case.
Ops with a static output shape (nonzero_static, index_put_ with a boolean mask) stay in the graph.
"""
import functools

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import kiln
from kiln.api import context_of
from kiln.capture.entry import FullGraphError
from support.capture import assert_same, break_reasons, clone, graph_count


def nonzero(x):
    return torch.nonzero(x > 0).float().sum() + x.sum()


def nonzero_method(x):
    return (x > 0).nonzero().shape[0] * x


def where_single_arg(x):
    return torch.where(x > 0)[0].float() * 2 + x.sum()


def masked_select(x):
    return torch.masked_select(x, x > 0) * 2


def bool_index(x):
    return x[x > 0].sum() * x


def len_of_masked(x):
    return len(x[x > 0]) + x.sum()


def masked_size_arithmetic(x):
    y = x[x > 0]
    return y.sum() + y.shape[0] % 3 + y.numel() // 2


# unique has no derivative: its input is detached, as a program that trains through it would.
def unique(x):
    return torch.unique(x.detach().round()) * 2 + x.sum()


def unique_counts(x):
    values, counts = torch.unique(x.detach().round(), return_counts=True)
    return values * counts + x.sum()


def unique_consecutive(x):
    return torch.unique_consecutive(x.detach().round()) * 2 + x.sum()


def bincount(x):
    return torch.bincount((x.abs() * 3).long()) * 2


def repeat_interleave_tensor(x):
    return torch.repeat_interleave(x, (x.abs() * 3).long()) * 2


def repeat_interleave_output_size(x):
    """With output_size the result's size is known: the op stays in the graph (both inputs repeat 22 times)."""
    return torch.repeat_interleave(x, (x.abs() * 3).long(), output_size=22) * 2


def argwhere(x):
    return torch.argwhere(x > 0) * 2 + 1


def item(x):
    return x * x.sum().item()


def tolist(x):
    return x * sum(x.tolist())


def nonzero_static(x):
    return torch.nonzero_static(x > 0, size=6) * 2


def index_put_bool_mask(x):
    y = x * 1
    y[y > 0] = 0.0
    return y * 2


def index_put_masked_values(x):
    """`y[m] = x[m] * 2`: the read breaks; the write stays in the graph, but its backward indexes by the mask."""
    y = torch.zeros_like(x)
    m = x > 0
    y[m] = x[m] * 2
    return y + 1


def nonzero_as_tuple(x):
    return torch.nonzero(x > 0, as_tuple=True)[0] * 2 + x.sum()


def unique_rows(x):
    return x.detach().view(2, 3).round().unique(dim=0) + x.sum()


def masked_scatter(x):
    return torch.zeros(6).masked_scatter(x > 0, x * 2) + 1


def count_nonzero(x):
    return torch.count_nonzero(x > 0) + x


def tensors_equal(x):
    return x * 2 if torch.equal(x, x.clone()) else x


def tensors_allclose(x):
    return (x + 1) * torch.allclose(x, x + 1e-9)


def full_from_tensor(x):
    """torch.full reads a tensor fill value into Python in eager; kiln fills from the tensor in the graph."""
    return torch.full((6,), x.detach().sum()) * x


class PositivePart(torch.nn.Module):
    """A module whose forward selects by a mask: the break is inside an inlined module call."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x)
        return h[h > 0].sum() + h.mean()


torch.manual_seed(0)
POSITIVE_PART = PositivePart()


def module_with_mask(x):
    return POSITIVE_PART(x.view(1, 6)) * 2


def nested_helper(x):
    def positives(t):
        return t[t > 0]

    return positives(x * 2).sum() + x.mean()


CASES = [nonzero, nonzero_method, where_single_arg, masked_select, bool_index, len_of_masked,
         masked_size_arithmetic, unique, unique_counts, unique_consecutive, bincount, repeat_interleave_tensor,
         repeat_interleave_output_size, argwhere, item, tolist, nonzero_static, index_put_bool_mask,
         index_put_masked_values, nonzero_as_tuple,
         unique_rows, masked_scatter, count_nonzero, tensors_equal, tensors_allclose, full_from_tensor,
         module_with_mask, nested_helper]
# No break: the op's output shape does not depend on data.
STATIC_SHAPE = {nonzero_static, index_put_bool_mask, masked_scatter, count_nonzero, full_from_tensor,
                repeat_interleave_output_size}
READS_A_VALUE = {item, tolist, tensors_equal, tensors_allclose}  # a Python value from tensor data

# Other values, same data-dependent sizes (positives, unique values, bins, repeats); changing sizes: below.
INPUTS = [torch.tensor([0.5, -1.2, 2.3, -0.1, 1.7, -2.4]), torch.tensor([-0.5, 1.2, -2.3, 0.1, -1.7, 2.4])]


@functools.lru_cache(maxsize=None)
def torch_compile_graphs(fn) -> int:
    """The reference: how many graphs torch.compile captures on the same case (the first input)."""
    torch._dynamo.reset()
    counter = CompileCounter()
    torch.compile(fn, backend=counter)(INPUTS[0].clone())
    torch._dynamo.reset()
    return counter.frame_count


def run_and_compare(fn, compiled, x, requires_grad):
    e_x, c_x = clone(x.requires_grad_(requires_grad)), clone(x)
    expected, actual = fn(e_x), compiled(c_x)
    assert_same(expected, actual)
    if requires_grad and expected.requires_grad:
        expected.sum().backward()
        actual.sum().backward()
        assert_same(e_x.grad, c_x.grad, path="grad")


# the masked write's backward needs a data-dependent size: with grad, its graph runs op by op (a graph fallback)
MASKED_WRITE_FALLS_BACK = pytest.mark.allows_fallback("graph: a masked write's backward needs a data-dependent size")


@pytest.mark.sampled(every=3, classes=("fn",))
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
@pytest.mark.parametrize("fn", [pytest.param(f, id=f.__name__,
                                             marks=MASKED_WRITE_FALLS_BACK if f is index_put_masked_values else ())
                                for f in CASES])
def test_data_dependent_op_breaks_cleanly(fn, backend, requires_grad):
    compiled = kiln.compile(fn, backend=backend)
    run_and_compare(fn, compiled, INPUTS[0].clone(), requires_grad)
    ctx = context_of(compiled)
    assert graph_count(ctx) <= torch_compile_graphs(fn)
    if fn in STATIC_SHAPE:
        assert break_reasons(ctx) == []
    elif fn in READS_A_VALUE:
        assert set(break_reasons(ctx)) == {"tensor_to_python"}
    else:
        assert set(break_reasons(ctx)) == {"dynamic_output_shape"}  # an inlined helper breaks in both frames
    run_and_compare(fn, compiled, INPUTS[1].clone(), requires_grad)


@pytest.mark.parametrize("fn", [nonzero, bool_index, unique, argwhere, nonzero_static], ids=lambda f: f.__name__)
def test_graph_count_matches_torch_compile(fn):
    compiled = kiln.compile(fn, backend="eager")
    compiled(INPUTS[0].clone())
    assert graph_count(context_of(compiled)) == torch_compile_graphs(fn)


def test_fullgraph_names_the_data_dependent_op():
    with pytest.raises(FullGraphError, match="dynamic_output_shape"):
        kiln.compile(bool_index, backend="eager", fullgraph=True)(INPUTS[0].clone())


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_len_of_dynamic_dimension_stays_symbolic(backend):
    """`len(t)` of a dynamic dimension is a symbolic size in the graph, not a name nothing binds."""
    def f(x):
        return x.sum() + len(x) * 2

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for n in (4, 7, 9):
        x = torch.randn(n)
        assert_same(f(x), compiled(x))
    assert graph_count(context_of(compiled)) == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_masked_result_sizes_change_between_calls(backend):
    """The continuation after the break sees a new size each call: it recompiles, then goes dynamic."""
    def f(x):
        y = x[x > 0]
        return y * len(y) + 1

    compiled = kiln.compile(f, backend=backend)
    for n in range(2, 9):
        x = torch.arange(n, dtype=torch.float32) - 1.5
        assert_same(f(x), compiled(x))


@MASKED_WRITE_FALLS_BACK
def test_masked_write_with_grad_runs_its_graph_eagerly_and_says_so(fallback_log):
    """The write's backward needs a data-dependent size: that graph runs op by op, a fallback said once."""
    compiled = kiln.compile(index_put_masked_values, backend="aot_eager")
    with pytest.warns(kiln.KilnFallbackWarning, match="depends on tensor data"):
        run_and_compare(index_put_masked_values, compiled, INPUTS[0].clone(), requires_grad=True)
    assert [(f.kind, f.stage) for f in fallback_log.records()] == [("graph", "autograd")]


FILLS = [torch.tensor(2), torch.tensor(1.5), torch.tensor(True), torch.tensor(2.5, dtype=torch.float64),
         torch.tensor(3, dtype=torch.int8)]


@pytest.mark.parametrize("fill", FILLS, ids=lambda t: str(t.dtype))
def test_full_from_a_tensor_has_eagers_dtype(fill):
    """full infers its dtype from the Python number (int64 for any integer tensor, the default float dtype)."""
    def f(x, v):
        return torch.full((3,), v) + x.sum().to(torch.int8)

    x = torch.randn(4)
    compiled = kiln.compile(f, backend="aot_eager")
    assert_same(f(x, fill), compiled(x, fill))
    assert graph_count(context_of(compiled)) == 1


def test_full_from_a_tensor_that_requires_grad_raises_like_eager():
    def f(x):
        return torch.full((3,), x.sum())

    x = torch.randn(4, requires_grad=True)
    with pytest.raises(TypeError, match="must be Number"):
        f(x)
    with pytest.raises(TypeError, match="must be Number"):
        kiln.compile(f, backend="aot_eager")(x)
