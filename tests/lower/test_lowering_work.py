"""Lowering does work linear in the graph on the shapes that made it quadratic, and its results stay eager's.

Every buffer lowering creates records which FX nodes it computes (its origins: what runs through ATen if its
kernel fails to build). kiln found them by walking the graph from the node being lowered through every value
inlined into it, once per buffer. Two shapes made that quadratic: a graph's outputs (the forward of a training
step returns hundreds of saved activations, each realized as a buffer while "the node being lowered" was the
output node, whose walk covered all of them), and values that many buffers read inlined (DenseNet's layers,
each concatenating every earlier feature map). DenseNet-121's forward took seconds in this walk alone.

The work is counted, not timed: `buffer_view` (is a value a buffer?) is asked about a value each time a walk
reaches it. Per node and edge of the graph, that count must not grow with the graph (a concatenation chain has
quadratically many edges itself: layer k reads k feature maps).
"""
from __future__ import annotations

import pytest
import torch

from kiln.lower import values
from kiln.lower.graph import lower_graph
from support.lowering import check, trace


def many_outputs(x, n: int):
    """A forward saving `n` activations for its backward: each is returned, each computed inline."""
    return tuple((x * (k + 1)).sin() for k in range(n))


def concat_chain(x, n: int):
    """DenseNet's pattern: each layer reads the concatenation of every earlier feature map."""
    features = [x]
    for _ in range(n):
        joined = torch.cat(features, 1)
        features.append((joined.sum(1, keepdim=True) * 0.5).relu())
    return torch.cat(features, 1), *features[1:]


def shared_inline_values(x, n: int):
    """`n` buffers (reductions) all reading one long chain of inlined pointwise values."""
    y = x
    for k in range(8):
        y = (y + k).cos()
    return tuple((y * (k + 1)).sum(0) for k in range(n))


def _work_per_graph_size(fn, n: int, monkeypatch) -> float:
    """`buffer_view` calls while lowering `fn` at size `n`, per node and edge of its graph."""
    x = torch.randn(4, 3)
    gm = trace(lambda t: fn(t, n), x)
    size = sum(1 + len(node.all_input_nodes) for node in gm.graph.nodes)
    calls = [0]
    original = values.IndexFunction.buffer_view

    def counted(self):
        calls[0] += 1
        return original(self)

    with monkeypatch.context() as m:
        m.setattr(values.IndexFunction, "buffer_view", counted)
        lower_graph(gm, [x])
    return calls[0] / size


@pytest.mark.parametrize("fn", [many_outputs, concat_chain, shared_inline_values])
def test_lowering_work_grows_linearly_with_the_graph(fn, monkeypatch):
    small, large = _work_per_graph_size(fn, 16, monkeypatch), _work_per_graph_size(fn, 64, monkeypatch)
    assert large <= 1.5 * small, (small, large)  # quadratic work in a linear graph: 4x


@pytest.mark.parametrize("fn", [many_outputs, concat_chain, shared_inline_values])
def test_results_match_eager(fn):
    check(lambda t: fn(t, 6), torch.randn(4, 3))


def test_a_buffer_realized_for_an_output_holds_that_output_only():
    """The origins of an output's buffer name the FX nodes that output computes, not every value returned."""
    x = torch.randn(4, 3)
    gm = trace(lambda t: many_outputs(t, 3), x)
    graph = lower_graph(gm, [x])
    per_buffer = [graph.origins[name] for name in graph.origins]
    assert per_buffer and all(len(nodes) == 2 for nodes in per_buffer), per_buffer  # its mul and its sin


class _ScansCounted(dict):
    """A layouts table that counts the passes over all of it."""

    scans = 0

    def items(self):
        _ScansCounted.scans += 1
        return super().items()

    def values(self):
        _ScansCounted.scans += 1
        return super().values()

    def __iter__(self):
        _ScansCounted.scans += 1
        return super().__iter__()


def _layout_scans(fn, n: int, monkeypatch) -> int:
    from kiln.lower import graph as lowering

    x = torch.randn(4, 3)
    gm = trace(lambda t: fn(t, n), x)
    original = lowering.GraphLowering.__init__

    def counted_layouts(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.layouts = _ScansCounted(self.layouts)

    _ScansCounted.scans = 0
    with monkeypatch.context() as m:
        m.setattr(lowering.GraphLowering, "__init__", counted_layouts)
        lower_graph(gm, [x])
    return _ScansCounted.scans


@pytest.mark.parametrize("fn", [many_outputs, shared_inline_values])
def test_no_buffer_scans_every_layout(fn, monkeypatch):
    """Each new buffer asked which buffers so far hold no element by scanning every layout (a second of BART's
    lowering); the passes over the whole table must not grow with the graph."""
    assert _layout_scans(fn, 64, monkeypatch) <= _layout_scans(fn, 16, monkeypatch) + 2
