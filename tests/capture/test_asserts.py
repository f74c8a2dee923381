"""`assert` on a tensor's value: a graph-side check, not a graph break, as torch.compile makes it.

`assert cond[, msg]` over a one-element tensor becomes `torch._assert_async(cond)` in the graph
(torch.compile does the same). When the check fails the graph raises and kiln re-runs the frame eagerly
(kiln.capture.rerun), so the user sees eager's AssertionError with its message, never a silent pass.
Under fullgraph=True, `t.item()` stays in the graph for the comparisons and asserts model code makes with
it (`assert lengths.max().item() <= slen` in XLM), as torch.compile captures `.item()` there; with
fullgraph=False it is a graph break in both. Each case runs eagerly, under kiln and under torch.compile
(counting backends) on an input the assert accepts and on one it rejects.

PYTEST_DONT_REWRITE: the cases are plain `assert` statements, which pytest would otherwise rewrite.
"""
import pytest
import torch
from torch._dynamo.testing import CompileCounter

import kiln
from kiln.capture.entry import FullGraphError
from support.capture import CountingBackend, assert_same


def all_positive(x):
    assert (x > 0).all(), "x must be positive"
    return x * 2


def all_positive_no_message(x):
    assert x.gt(0).all()
    return x.log()


def zero_dim_truth(x):
    assert x.sum()
    return x + 1


def item_bound(x, n):
    assert x.max().item() <= n
    return x * 2


def item_bool(x):
    assert torch.all(x >= 0).item(), "Verify that `x` has only positive values"
    return x.sqrt()


def item_float_bound(x):
    assert x.abs().max().item() < 10.0, "too large"
    return x.tanh()


def item_mirrored(x, n):
    assert n > x.min().item()
    return x - n


def item_against_item(x):
    assert x.min().item() <= x.max().item()
    return x.cumsum(0)


# (function, an input the assert accepts, one it rejects)
CASES = {
    "all_positive": (all_positive, (torch.rand(4) + 0.1,), (torch.randn(4) - 5,)),
    "all_positive_no_message": (all_positive_no_message, (torch.rand(3, 2) + 1,), (-torch.rand(3, 2),)),
    "zero_dim_truth": (zero_dim_truth, (torch.ones(3),), (torch.zeros(3),)),
    "item_bound": (item_bound, (torch.arange(4), 5), (torch.arange(9), 5)),
    "item_bool": (item_bool, (torch.rand(5),), (torch.rand(5) - 2,)),
    "item_float_bound": (item_float_bound, (torch.randn(4),), (torch.randn(4) * 100 + 50,)),
    "item_mirrored": (item_mirrored, (torch.arange(1, 4), 3), (torch.arange(1, 4), 0)),
    "item_against_item": (item_against_item, (torch.randn(6),), None),
}


def _outcome(fn, args):
    try:
        return fn(*args), None
    except Exception as e:
        return None, e


def _torch_fullgraph_graphs(fn, args) -> int | None:
    """torch.compile(fullgraph=True)'s graph count, None where it refuses."""
    counter = CompileCounter()
    try:
        torch.compile(fn, backend=counter, fullgraph=True)(*args)
    except Exception:
        return None
    return counter.frame_count


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "breaks_allowed"])
def test_assert_on_tensor_value(name, fullgraph):
    fn, good, bad = CASES[name]
    torch._dynamo.reset()
    torch_graphs = _torch_fullgraph_graphs(fn, good)
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend, fullgraph=fullgraph)
    assert_same(fn(*good), compiled(*good))
    if fullgraph:  # kiln gives one graph wherever torch.compile does
        assert torch_graphs == 1 and backend.graphs == 1
    if bad is not None:
        expected, error = _outcome(fn, bad)
        assert isinstance(error, AssertionError)
        with pytest.raises(AssertionError) as raised:
            compiled(*bad)
        assert str(raised.value) == str(error)
    assert_same(fn(*good), compiled(*good))  # a failed check left the entry in place


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_assert_check_raises_under_compiling_backends(backend):
    compiled = kiln.compile(item_bool, backend=backend, fullgraph=True)
    x = torch.rand(5, requires_grad=True)
    assert_same(item_bool(x), compiled(x))
    with pytest.raises(AssertionError, match="only positive values"):
        compiled(torch.rand(5) - 2)


def sum_above(x):
    assert x.sum() > -100, "sum too small"
    return (x * 2).sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_assert_check_survives_the_training_partition(backend):
    """With inputs requiring grad the graph is split into forward and backward: the check, which no
    output reads, must stay in the forward (autograd/partition.py CHECK_OPS), not be dropped."""
    compiled = kiln.compile(sum_above, backend=backend)
    x = torch.randn(4, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    sum_above(x).backward()
    compiled(y).backward()
    assert_same(x.grad, y.grad)
    with pytest.raises(AssertionError, match="sum too small"):
        compiled(torch.full((4,), -100.0, requires_grad=True))


def test_assert_on_several_values_raises_what_eager_raises():
    """`assert t` with more than one value is ambiguous: eager raises RuntimeError, and so does kiln."""
    def several(x):
        assert x > 0
        return x

    with pytest.raises(RuntimeError, match="ambiguous"):
        several(torch.ones(3))
    with pytest.raises(RuntimeError, match="ambiguous"):
        kiln.compile(several, backend=CountingBackend())(torch.ones(3))


def item_branch(x):
    if x.sum().item() > 0:
        return x + 1
    return x - 1


def item_as_size(x):
    return torch.zeros(int(x.sum().item())) + 1


def test_item_in_a_python_branch_still_breaks():
    """A branch on `.item()` needs the number in Python: torch.compile(fullgraph=True) refuses it, and so
    does kiln; with fullgraph=False both break and compute eager's result."""
    x = torch.ones(3)
    assert _torch_fullgraph_graphs(item_branch, (x,)) is None
    with pytest.raises(FullGraphError):
        kiln.compile(item_branch, backend=CountingBackend(), fullgraph=True)(x)
    torch._dynamo.reset()
    counter = CompileCounter()
    torch.compile(item_branch, backend=counter)(x)
    backend = CountingBackend()
    assert_same(item_branch(x), kiln.compile(item_branch, backend=backend)(x))
    assert backend.graphs <= counter.frame_count


@pytest.mark.xfail(strict=True, raises=FullGraphError, reason="capture gap: `.item()` read as a size needs an "
                   "unbacked symbolic int, which torch.compile(fullgraph=True) makes and kiln does not")
def test_item_as_a_size_under_fullgraph():
    x = torch.ones(3)
    assert _torch_fullgraph_graphs(item_as_size, (x,)) == 1
    assert_same(item_as_size(x), kiln.compile(item_as_size, backend=CountingBackend(), fullgraph=True)(x))


def scaled_by_max(x):
    return x * x.max().item()


def shifted_by_count(x):
    return x.long() + (x > 0).sum().item()


def divided_by_count(x):
    return (x > 0).sum().item() / (x.abs() + 1)


def masked_by_flag(x):
    return x.int() + (x > 0).any().item()


def narrowed_by_mean(x):
    return x.half() - x.mean().item()


@pytest.mark.parametrize("fn", [scaled_by_max, shifted_by_count, divided_by_count, masked_by_flag,
                                narrowed_by_mean], ids=lambda f: f.__name__)
def test_item_in_tensor_arithmetic_under_fullgraph(fn):
    """`x * t.item()` under fullgraph=True: one graph, as torch.compile makes, with eager's dtype (the number
    kept as a 0-d tensor, which promotes as the Python number would). torch.compile refuses a bool `.item()`
    in arithmetic (it guards on the unbacked value); kiln captures it."""
    x = torch.randn(5)
    assert _torch_fullgraph_graphs(fn, (x,)) == (None if fn is masked_by_flag else 1)
    backend = CountingBackend()
    assert_same(fn(x), kiln.compile(fn, backend=backend, fullgraph=True)(x))
    assert backend.graphs == 1


def test_float_item_against_an_int_tensor_breaks():
    """An int tensor times a float: Python's float makes the default dtype, a float64 0-d tensor would make
    float64, so kiln reads the number (a break; under fullgraph=True an error torch.compile does not give)."""
    def int_times_mean(x):
        return x.long() * x.mean().item()

    x = torch.randn(4)
    with pytest.raises(FullGraphError, match="Tensor.item"):
        kiln.compile(int_times_mean, backend=CountingBackend(), fullgraph=True)(x)
    assert_same(int_times_mean(x), kiln.compile(int_times_mean, backend=CountingBackend())(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.bool])
def test_item_returned_under_fullgraph_is_eagers_number(dtype):
    def total(x):
        return x.sum().to(dtype).item(), x * 2

    x = torch.randn(4) * 3
    expected, got = total(x), kiln.compile(total, backend=CountingBackend(), fullgraph=True)(x)
    assert type(got[0]) is type(expected[0]) and got[0] == expected[0]
    assert_same(expected[1], got[1])


def test_item_compared_with_an_int_beyond_float_precision_breaks():
    """A float `.item()` against an int no float64 holds exactly: Python compares them exactly, a float64
    tensor would not, so kiln reads the number instead of comparing in the graph."""
    def beyond(x):
        assert x.sum().item() < 2**60 + 1
        return x

    with pytest.raises(FullGraphError, match="Tensor.item"):
        kiln.compile(beyond, backend=CountingBackend(), fullgraph=True)(torch.ones(2))
    assert_same(beyond(torch.ones(2)), kiln.compile(beyond, backend=CountingBackend())(torch.ones(2)))
