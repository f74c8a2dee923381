"""Fusion does work linear in the graph, and the kernels it makes are eager's values.

A node joins its last producer's kernel, else the latest kernel after that producer whose loops take it. A value
read from the graph's inputs alone (a training step's weight cast, traced just before the matmul that reads it)
has no producer in the graph, so every kernel before it is a candidate: fusion listed them all and checked each
template kernel among them (the Triton target's matmuls) before trying the first, which is quadratic in the
number of layers. Candidates are now tried lazily, and the first kernel that takes the node ends the walk.

The work is counted, not timed: the kernels asked whether they take a node, per node of the graph, must not grow
with the graph.
"""
from __future__ import annotations

import pytest
import torch

from kiln.lower import ir
from kiln.lower.graph import lower_graph
from kiln.schedule import fusion
from support.lowering import check, trace


def casts_before_each_layer(x, n: int):
    """`n` layers, each a row reduction and the pointwise ops after it, each reading a value computed from the
    input alone just before the layer."""
    y = x
    for k in range(n):
        w = (x * (k + 2)).cos()
        y = (y.sum(1, keepdim=True) + y * w).relu()
    return y


def casts_read_by_matmuls(x, n: int):
    """`n` layers, each a matmul (an extern: no candidate kernel) reading a value computed from the input alone,
    then pointwise ops and a row reduction over its result."""
    y = x
    for k in range(n):
        w = (x.t() * (k + 2)).cos()
        h = torch.mm(y, w).relu()
        y = h[:, :3] - h.sum(1, keepdim=True)
    return y


def _work_per_node(fn, n: int, monkeypatch) -> float:
    """Kernels asked whether they take a node (`try_add`, and `_epilogue_ok` for template kernels) while
    scheduling `fn` at size `n`, per node of its lowered graph. The graph's reductions stand for templates."""
    x = torch.randn(4, 3)
    graph = lower_graph(trace(lambda t: fn(t, n), x), [x])
    templates = {node.name: None for node in graph.nodes
                 if isinstance(node, ir.ComputedBuffer) and node.is_reduction()}
    calls = [0]

    def counted(original):
        def run(*args):
            calls[0] += 1
            return original(*args)
        return run

    with monkeypatch.context() as m:
        m.setattr(fusion, "try_add", counted(fusion.try_add))
        m.setattr(fusion, "_epilogue_ok", counted(fusion._epilogue_ok))
        fusion.schedule(graph, templates, epilogue_fusion=True)
    return calls[0] / len(graph.nodes)


@pytest.mark.parametrize("fn", [casts_before_each_layer, casts_read_by_matmuls])
def test_fusion_work_grows_linearly_with_the_graph(fn, monkeypatch):
    small, large = _work_per_node(fn, 16, monkeypatch), _work_per_node(fn, 64, monkeypatch)
    assert large <= 1.5 * small, (small, large)  # quadratic work in a linear graph: 4x


@pytest.mark.parametrize("fn", [casts_before_each_layer, casts_read_by_matmuls])
def test_results_match_eager(fn):
    check(lambda t: fn(t, 6), torch.randn(4, 3))


def test_values_read_from_the_input_join_the_running_kernel():
    """Each layer's cast joins the kernel of the layers before it (the latest that takes it), so the whole stack
    is one kernel: the lazy walk keeps the order in which candidates were tried."""
    x = torch.randn(4, 3)
    graph = lower_graph(trace(lambda t: casts_before_each_layer(t, 4), x), [x])
    sched = fusion.schedule(graph, epilogue_fusion=True)
    assert len(sched.kernels()) == 1, sched
