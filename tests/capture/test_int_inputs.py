"""An int input that changes between calls becomes a symbol of the graph (automatic dynamic for ints).

torch.compile specializes an int argument on its first value; when a call brings another value it recompiles
with the int as a SymInt input, guarded only by the relations the graph needed (a bound an index keeps
within, a reshape's divisibility), so later values reuse that graph. kiln does the same
(`builder.is_symbolic_int`, `GraphBuilder.int_input`). Each case calls a function with a sequence of ints,
compares every result with eager's, and the number of graphs compiled with torch.compile's, measured here.
"""
import numpy as np
import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import kiln
from support.capture import CountingBackend, assert_same


def _graphs_side_by_side(fn, calls, make_x=lambda: torch.randn(20, 4), **options):
    """(kiln's graphs, torch.compile's frames) over `calls` (each a tuple of the ints after x, or a dict of
    keyword arguments), every kiln result compared with eager's."""
    torch._dynamo.reset()
    counter, backend = CompileCounter(), CountingBackend()
    by_torch, by_kiln = torch.compile(fn, backend=counter, **options), kiln.compile(fn, backend=backend, **options)
    for call in calls:
        x = make_x()
        args, kwargs = (call, {}) if isinstance(call, tuple) else ((), call)
        by_torch(x, *args, **kwargs)
        assert_same(fn(x, *args, **kwargs), by_kiln(x, *args, **kwargs))
    return backend.graphs, counter.frame_count


# where the int goes, and the values it takes (each row of benchmarks/int_input_recompiles.py, and more)
USES = {
    "add": (lambda x, n: x + n, [2, 3, 4, 5]),
    "prefix": (lambda x, n: x[:n] * 2, [2, 3, 4, 5]),
    "range": (lambda x, n: x[1:n] * 2, [2, 3, 4, 5]),
    "step": (lambda x, n: x[::n] * 2, [2, 3, 4, 5]),
    "index": (lambda x, n: x[n] * 2, [2, 3, 4, 5]),
    "narrow": (lambda x, n: x.narrow(0, 0, n) * 2, [2, 3, 4, 5]),
    "arange": (lambda x, n: torch.arange(n) * 2, [2, 3, 4, 5]),
    "reshape": (lambda x, n: x.reshape(n, -1) * 2, [2, 5, 10, 20]),
    "negative_index": (lambda x, n: x[n] * 2, [2, 3, -1, -5, -20]),
    "negative_start": (lambda x, n: x[n:] * 2, [2, 3, -3, -25, 25]),
    "negative_arithmetic": (lambda x, n: x * n - n // 3 + n % 4, [2, -3, -7, 5]),
    "size_and_arithmetic": (lambda x, n: x[:n] * n + torch.ones(n, 1) * (n - 1), [2, 3, 4, 6]),
    "new_size": (lambda x, n: x.new_zeros(n, 4) + x[:n], [2, 3, 4, 5]),
    "roll": (lambda x, n: torch.roll(x, n, 0), [2, 3, -4, 5]),
    "zero_and_one_after": (lambda x, n: x[n] * 2, [2, 3, 1, 0, 4]),
    "tensor_of_it": (lambda x, n: torch.tensor([n, 2 * n]) * x[:2, 0], [2, 3, 4, 5]),
    "clamped_by_min": (lambda x, n: x[:min(n, 6)] * max(n, 1), [2, 3, 9, 5]),
}


@pytest.mark.parametrize("name", USES)
def test_an_int_input_is_a_symbol_once_it_changes(name):
    fn, values = USES[name]
    ours, theirs = _graphs_side_by_side(fn, [(n,) for n in values])
    assert ours == theirs


def test_two_int_inputs():
    ours, theirs = _graphs_side_by_side(lambda x, n, m: x[n:m] * (m - n), [(2, 5), (3, 6), (4, 9), (1, 3)])
    assert ours == theirs


def test_an_int_keyword_argument():
    def fn(x, *, length=3):
        return x[:length].sum(0) * length

    ours, theirs = _graphs_side_by_side(fn, [{"length": n} for n in (2, 3, 4, 7)])
    assert ours == theirs


def test_an_int_in_a_list_argument():
    def fn(x, bounds):
        return x[bounds[0]:bounds[1]] * bounds[1]

    ours, theirs = _graphs_side_by_side(fn, [([1, 5],), ([2, 6],), ([3, 9],), ([0, 4],)])
    assert ours == theirs


def test_an_int_attribute_of_a_module_stays_specialized():
    """A module's ints are configuration: torch.compile and kiln specialize them per value."""

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.keep = 2

        def forward(self, x):
            return x[:self.keep] * 2

    head = Head()

    def fn(x, n):
        head.keep = n
        return head(x)

    ours, theirs = _graphs_side_by_side(fn, [(n,) for n in (2, 3, 4)])
    assert ours == theirs


@pytest.mark.parametrize("dynamic", [False, True])
def test_dynamic_false_specializes_and_true_starts_symbolic(dynamic):
    ours, theirs = _graphs_side_by_side(lambda x, n: x[:n] * n, [(n,) for n in (2, 3, 4, 5)], dynamic=dynamic)
    assert ours == theirs == (1 if dynamic else 4)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_symbolic_int_through_the_backends(backend):
    """The AOT stage takes the SymInt as an input of its ATen graphs, and the code generator binds it per call
    (a graph that baked the first value in would return the wrong rows for later ones)."""

    def fn(x, n):
        return x[n:] * n + x[n] - x[n // 2 - 4]

    compiled = kiln.compile(fn, backend=backend)
    for n in (2, 3, -3, 7, -5, 19):
        x = torch.randn(20, 4)
        assert_same(fn(x, n), compiled(x, n))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_training_with_a_symbolic_int(backend):
    def step(x, w, n):
        return ((x[:n] @ w) * n).sum()

    compiled = kiln.compile(step, backend=backend)
    for n in (2, 3, 5, 4):
        x, w = torch.randn(8, 3), torch.randn(3, 2)
        w_ref, w_ours = w.clone().requires_grad_(), w.clone().requires_grad_()
        loss_ref, loss = step(x, w_ref, n), compiled(x, w_ours, n)
        loss_ref.backward()
        loss.backward()
        assert_same(loss_ref, loss)
        assert_same(w_ref.grad, w_ours.grad)


def test_a_value_outside_the_guarded_relation_recompiles():
    """The graph for n >= 0 indexes from the start; n = -1 fails its bound and compiles a graph of its own."""
    backend = CountingBackend()
    compiled = kiln.compile(lambda x, n: x[n] * 2, backend=backend)
    x = torch.randn(5, 3)
    for n, graphs in [(1, 1), (2, 2), (4, 2), (-1, 3), (-5, 3)]:
        assert_same(x[n] * 2, compiled(x, n))
        assert backend.graphs == graphs
    with pytest.raises(IndexError):
        compiled(x, 5)


def test_the_recompile_reason_names_the_relation_and_the_value(caplog):
    compiled = kiln.compile(lambda x, n: x[n] * 2, backend=CountingBackend())
    x = torch.randn(5, 3)
    with caplog.at_level("INFO", logger="kiln.recompiles"):
        for n in (1, 2, -1):
            compiled(x, n)
    reasons = [r.getMessage() for r in caplog.records if r.name == "kiln.recompiles"]
    assert "L['n'] changed 1 -> 2: now dynamic" in reasons[0]
    assert "expected 0 <= L['n']" in reasons[1] and "got values [-1]" in reasons[1]


# where Python needs the int's value: the symbol is specialized (a guard on its value), not a graph break
PYTHON_USES = {
    "repeated_list": lambda x, n: x * len([0] * n),
    "repeated_string": lambda x, n: x * len("ab" * n),
    "percent_format": lambda x, n: x * len("%d" % n),
    "f_string": lambda x, n: x * len(f"{n:04d}"),
    "method": lambda x, n: x * n.bit_length(),
    "numpy_of_it": lambda x, n: x * np.sqrt(n),
    "invert": lambda x, n: x * ~n,
    "list_index": lambda x, n: x * [1, 2, 3, 4, 5, 6][n],
}


@pytest.mark.parametrize("name", PYTHON_USES)
def test_a_symbolic_int_read_by_python_is_specialized(name):
    fn = PYTHON_USES[name]
    backend = CountingBackend()
    compiled = kiln.compile(fn, backend=backend, dynamic=True, fullgraph=True)
    for n in (3, 4, 3):
        x = torch.randn(4)
        assert_same(fn(x, n), compiled(x, n))
    assert backend.graphs == 2  # one per value, the value guarded
