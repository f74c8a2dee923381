"""Functional collectives in an ATen graph are started early and waited for late (kiln/lower/collectives.py).

The reorder is checked on hand-built graphs: no process group is needed to move nodes.
"""
from __future__ import annotations

import torch
import torch.fx

from kiln.lower.collectives import place_collectives

aten, c10d = torch.ops.aten, torch.ops._c10d_functional


def _order(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "call_function"]


def _graph(build) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    graph.output(build(graph, x, y))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_wait_moves_after_independent_compute():
    def build(g, x, y):
        start = g.call_function(c10d.all_reduce.default, (x, "sum", "0"), name="start")
        wait = g.call_function(c10d.wait_tensor.default, (start,), name="wait")
        independent = g.call_function(aten.mul.Tensor, (y, 2), name="independent")
        return (g.call_function(aten.add.Tensor, (wait, independent), name="use"),)
    gm = _graph(build)
    assert place_collectives(gm)
    assert _order(gm) == ["start", "independent", "wait", "use"]


def test_start_moves_up_to_its_input_and_collectives_keep_their_order():
    def build(g, x, y):
        a = g.call_function(aten.mul.Tensor, (y, 3), name="busy")
        first = g.call_function(c10d.all_reduce.default, (x, "sum", "0"), name="first")
        produced = g.call_function(aten.sin.default, (x,), name="produced")
        second = g.call_function(c10d.all_gather_into_tensor.default, (produced, 2, "0"), name="second")
        waits = [g.call_function(c10d.wait_tensor.default, (s,), name=f"wait_{s.name}") for s in (first, second)]
        return (g.call_function(aten.add.Tensor, (waits[0], a), name="use_first"), waits[1])
    gm = _graph(build)
    place_collectives(gm)
    order = _order(gm)
    assert order.index("first") == 0  # its input is a placeholder: it starts before any compute
    assert order.index("first") < order.index("second")  # every rank issues them in program order
    assert order.index("second") == order.index("produced") + 1
    assert order.index("wait_first") == order.index("use_first") - 1


def test_graph_without_collectives_is_untouched():
    def build(g, x, y):
        return (g.call_function(aten.add.Tensor, (x, y), name="add"),)
    gm = _graph(build)
    assert not place_collectives(gm)
    assert _order(gm) == ["add"]
