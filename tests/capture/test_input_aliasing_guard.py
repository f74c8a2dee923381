"""The "input aliasing" guard: a graph that writes an input is specialized on which inputs share storage."""
import torch

import kiln
from kiln.api import context_of
from kiln.capture.guards import input_aliasing
from support.capture import graph_count, recompile_reasons


def add_then_read(a, b):
    a.add_(1)
    return a[:3] + b[:3]


def only_read(a, b):
    return a[:3] + b[:3]


def test_input_aliasing_names_the_first_tensor_on_each_storage_and_offsets_where_shared():
    x, y = torch.zeros(6), torch.zeros(6)
    assert input_aliasing((x, y, x[2:], y.view(2, 3)), (4, 4, 4, 4)) == ((0, 0), (1, 0), (0, 8), (1, 0))
    assert input_aliasing((x, y), (4, 4)) == ((0, 0), (1, 0))
    assert input_aliasing((torch.zeros(0), torch.zeros(0)), (4, 4)) == ((0, 0), (1, 0))  # no bytes: no aliasing


def test_a_change_of_aliasing_recompiles_a_writing_graph():
    compiled = kiln.compile(add_then_read, backend="eager")
    x, y = torch.zeros(5), torch.zeros(5)
    compiled(x, y)
    compiled(x, x)
    compiled(x, x[:3])
    compiled(x, x)
    ctx = context_of(compiled)
    assert graph_count(ctx) == 3
    assert any("input aliasing" in r for r in recompile_reasons(ctx))


def test_a_graph_that_only_reads_its_inputs_is_not_guarded_on_aliasing():
    compiled = kiln.compile(only_read, backend="eager")
    x, y = torch.zeros(5), torch.zeros(5)
    for args in ((x, y), (x, x), (x, x[::1]), (x, x.detach())):
        torch.testing.assert_close(compiled(*args), only_read(*args))
    assert graph_count(context_of(compiled)) == 1


def transpose_then_read(a, b):
    a.t_()
    return b + 1


def test_one_tensor_passed_twice_is_one_graph_input():
    """`f(x, x)`: an in-place view op through `a` shows through `b`, as in eager; a call with two tensors
    fails the identity guard and recompiles."""
    compiled = kiln.compile(transpose_then_read, backend="eager")
    for same in (True, False, True):
        results = []
        for fn in (transpose_then_read, compiled):
            x, y = torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)
            out = fn(x, x if same else y)
            results.append((out, x.shape, x.stride()))
        torch.testing.assert_close(results[1][0], results[0][0])
        assert results[1][1:] == results[0][1:]
    ctx = context_of(compiled)
    assert graph_count(ctx) == 2
    first = next(r.graph for r in ctx.records if r.graph is not None)
    assert len(first.graph.find_nodes(op="placeholder")) == 1


def test_one_tensor_under_two_names_compiles_twice_over_many_sizes():
    """`model(input_ids=ids, labels=ids)`: the second name is guarded to be the same tensor, and its sizes are
    the first name's, so automatic dynamic makes them symbolic once (not a recompile per size)."""
    def loss(ids, labels):
        return (ids * 2 - labels).sum()

    compiled = kiln.compile(loss, backend="eager")
    for n in (4, 6, 9, 13):
        ids = torch.arange(n)
        assert compiled(ids, ids) == loss(ids, ids)
    assert graph_count(context_of(compiled)) == 2
    other = torch.arange(13)
    assert compiled(torch.arange(13), other) == loss(torch.arange(13), other)  # two tensors now: a recompile
    assert graph_count(context_of(compiled)) == 3
