"""kiln/autograd/written_regions.py: where writes need functionalization's re-trace, only the nodes on the
written storages are traced again, and the graph is the one the whole re-trace gives.

An encoder-decoder's decoder input is written through views of three geometries (`shift_tokens_right`); the
whole joint graph of BART's training step was re-traced for it. Each case here is compared with the whole
re-trace (node by node, up to names) and with eager.
"""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.autograd import functionalize as functionalize_module
from kiln.autograd.functionalize import functionalize
from kiln.autograd.signature import TensorSpec
from kiln.autograd.written_regions import functionalize_written_region


def shift_tokens_right(ids, x):
    """transformers' decoder input: a fresh tensor written through a slice, a column, then masked as a whole."""
    shifted = ids.new_zeros(ids.shape)
    shifted[:, 1:] = ids[:, :-1].clone()
    shifted[:, 0] = 2
    shifted.masked_fill_(shifted == -100, 1)
    return [x * 2 + shifted.float().sum(-1, keepdim=True), shifted]


def read_between_writes(x):
    """Readers of the written tensor and of a view of it, before and after each write: each sees the value of
    its own time."""
    t = torch.zeros(4, 6)
    row = t[1]
    t[:, 2:4] = x[:, :2]
    before = row * 3
    t[1] = x[2] + 1
    col = t[:, 0]
    t[:, 0].add_(5)
    return [before, row + 1, col * 2, t.sum(0)]


def random_ops_in_order(x):
    """A random write into a fresh tensor between two draws outside it: the draws keep eager's order."""
    a = torch.rand_like(x)
    mask = torch.empty(4, 6)
    mask[:, :3].bernoulli_(0.5)
    mask[:, 3:] = 1
    b = torch.rand_like(x)
    return [x * mask + a - b]


def written_views_returned(x):
    """The written tensor's views returned, one made before the writes (replayed on the new value)."""
    t = x.new_zeros(3, 4)
    first = t[0]
    t[:, 1] = x[:, 0]
    t[0, :2] = 7
    return [first, t.t(), t[2:]]


CASES = [
    (shift_tokens_right, lambda: (torch.randint(0, 50, (2, 7)), torch.randn(2, 1))),
    (read_between_writes, lambda: (torch.randn(4, 6),)),
    (random_ops_in_order, lambda: (torch.randn(4, 6),)),
    (written_views_returned, lambda: (torch.randn(3, 4),)),
]


def whole_retrace(traced, inputs, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(functionalize_module, "_rewrite_writes", lambda gm: None)
        m.setattr(functionalize_module, "functionalize_written_region", lambda gm: None)
        return functionalize(traced, [TensorSpec.of(t) for t in inputs])


def structure(gm) -> list:
    position, out = {}, []
    for k, node in enumerate(gm.graph.nodes):
        position[node] = k
        val = node.meta.get("val")
        meta = (tuple(val.shape), val.stride(), val.dtype) if isinstance(val, torch.Tensor) else repr(val)
        target = str(node.target) if node.op == "call_function" else None
        out.append((node.op, target, repr(torch.fx.map_arg((node.args, node.kwargs), position.get)), meta))
    return out


@pytest.mark.parametrize("fn, args", CASES, ids=[c[0].__name__ for c in CASES])
def test_the_written_region_alone_gives_the_whole_retraces_graph(fn, args, monkeypatch):
    inputs = args()
    traced = make_fx(fn, tracing_mode="fake")(*inputs)
    assert functionalize_module._rewrite_writes(traced) is None  # the writes need the re-trace
    assert functionalize_written_region(traced) is not None
    graph, mutations = functionalize(traced, [TensorSpec.of(t) for t in inputs])
    expected, expected_mutations = whole_retrace(traced, inputs, monkeypatch)
    assert structure(graph) == structure(expected)
    assert mutations == expected_mutations == []
    torch.manual_seed(0)
    got = graph(*inputs)
    torch.manual_seed(0)
    want = fn(*inputs)
    torch.testing.assert_close(got, want)


def test_a_written_input_is_left_to_the_whole_retrace():
    """functionalization copies a written input's new value back: the region alone does not hold that copy."""
    def write_input_columns(x):
        x[:, 0] = 1
        x[1:] *= 2
        return [x + 1]

    traced = make_fx(write_input_columns, tracing_mode="fake")(torch.randn(3, 4))
    assert functionalize_written_region(traced) is None
    x = torch.randn(3, 4)
    graph, mutations = functionalize(traced, [TensorSpec.of(x)])
    eager = x.clone()
    want = write_input_columns(eager)
    got = graph(x.clone())
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[mutations[0].output_index], eager)


def test_an_out_argument_is_the_written_tensor():
    """`torch.mul(u, 2, out=t[:, :3])` writes `t`, not `u` (its first argument): the region is `t`'s."""
    def written_through_out(x):
        u = x * 1
        t = torch.zeros(4, 6)
        torch.mul(u[:, :3], 2, out=t[:, :3])
        return [t * 2, u + 1]

    x = torch.randn(4, 6)
    traced = make_fx(written_through_out, tracing_mode="fake")(x)
    assert functionalize_written_region(traced) is not None
    graph, _ = functionalize(traced, [TensorSpec.of(x)])
    torch.testing.assert_close(graph(x), written_through_out(x))


def test_a_write_returning_nothing_is_left_to_the_whole_retrace():
    """`torch._foreach_add_` writes its tensors and returns nothing: no value to place it by."""
    def foreach_into_own_tensors(x):
        a, b = torch.zeros(3, 4), torch.ones(3, 4)
        a[:, 0] = x[:, 0]
        torch._foreach_add_([a[:, 1:], b], 2.0)
        return [a * b, b + x]

    x = torch.randn(3, 4)
    traced = make_fx(foreach_into_own_tensors, tracing_mode="fake")(x)
    assert functionalize_written_region(traced) is None
    graph, _ = functionalize(traced, [TensorSpec.of(x)])
    torch.testing.assert_close(graph(x), foreach_into_own_tensors(x))
