"""kiln/lower/decompose_nodes.py: the decompose stage traces again only the nodes that decompose.

A forward graph of an encoder-decoder held one `select_scatter` (its decoder input, `ids[:, 0] = start`) among
3,000 nodes, and the stage re-traced all of them for it. Each such node is now traced alone and spliced in; the
graph that results holds the ops a whole re-trace records and computes what eager computes.
"""
from __future__ import annotations

import collections
import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import pipeline
from kiln.lower.decompositions import decomposes
from kiln.pipeline import compile_aten_graph

aten = torch.ops.aten


def decoder_input_and_normed(ids, x, weight, bias):
    """An encoder-decoder's shifted decoder input beside ops that decompose (softmax, a layer norm's three
    results) and ops that do not."""
    shifted = torch.select_scatter(torch.slice_scatter(torch.zeros_like(ids), ids[:, :-1], 1, 1), ids[:, 0] * 0 + 2,
                                   1, 0)
    normed, mean, rstd = aten.native_layer_norm(x * 2, [x.shape[-1]], weight, bias, 1e-5)
    return shifted, normed.softmax(-1) + 1, mean, rstd


def inputs():
    return (torch.randint(0, 50, (4, 9)), torch.randn(4, 6, 8), torch.randn(8), torch.randn(8))


def traced(mode):
    with torch.no_grad():
        return make_fx(decoder_input_and_normed, tracing_mode=mode)(*inputs())


def example_values(gm):
    return [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]


def ops(gm) -> collections.Counter:
    return collections.Counter(n.target for n in gm.graph.nodes if n.op == "call_function")


def test_only_the_nodes_that_decompose_are_traced_again(monkeypatch):
    gm = traced("fake")
    assert any(decomposes(n) for n in gm.graph.nodes if n.op == "call_function")
    whole = pipeline._retrace(gm, example_values(gm), False)
    monkeypatch.setattr(pipeline, "_retrace", lambda *a: pytest.fail("the whole graph was traced again"))
    decomposed = pipeline.decompose(gm, example_values(gm))
    assert not any(pipeline._needs_decomposing(n, False) for n in decomposed.graph.nodes)
    assert ops(decomposed) == ops(whole)
    kept = [n for n in gm.graph.nodes if n.op == "call_function" and not decomposes(n)
            and n.target is not operator.getitem]
    assert {n.name for n in kept} <= {n.name for n in decomposed.graph.nodes}  # copied as they are


def test_the_decomposed_graph_computes_what_eager_computes():
    gm = traced("fake")
    real = inputs()
    compiled = compile_aten_graph(gm, example_values(gm))
    got, want = compiled(*real), decoder_input_and_normed(*real)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_symbolic_sizes_trace_the_whole_graph_again(monkeypatch):
    gm = traced("symbolic")
    calls = []
    retrace = pipeline._retrace
    monkeypatch.setattr(pipeline, "_retrace", lambda *a: calls.append(1) or retrace(*a))
    decomposed = pipeline.decompose(gm, example_values(gm))
    assert calls == [1]
    assert not any(pipeline._needs_decomposing(n, False) for n in decomposed.graph.nodes)
