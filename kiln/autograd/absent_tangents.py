"""The backward graph for a call whose loss does not reach every differentiable output.

Autograd hands the compiled backward `None` for an output the loss does not reach, and
the runtime feeds the graph a zero tangent in its place. In exact arithmetic that is
the same, but eager never runs the backward formulas of such an output at all: a
formula that multiplies the zero by an infinity (`sqrt`'s `grad / (2 * result)` at 0,
`div`'s `grad / other` at 0) makes NaN in the graph where eager's gradient is finite.

`without_absent_tangents` rewrites a copy of the backward graph for one set of absent
tangents: every value computed only from absent tangents (and saved values) is, in exact
arithmetic, zero, so where such a value feeds one that also depends on a present
tangent, it is replaced by zeros of its shape. Values built from an absent tangent by
ops that keep a zero exactly zero (views, sums, negation, ...) need no replacement: the
zero tangent already makes them zero, and when nothing else needs one the graph is used
as it is (no second compile).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from kiln.effects import eliminate_dead_code
from kiln.runtime.compile_lock import build_once
from kiln.runtime.lazy_graphs import graph_module

aten = torch.ops.aten

# Ops whose output is exactly zero when their tensor inputs are (whatever their other, non-tensor args):
# zero tangents flowing through them make no NaN.
_ZERO_PRESERVING = frozenset((
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
    aten.permute.default, aten.t.default, aten.transpose.int, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.unsqueeze.default, aten.clone.default, aten.alias.default,
    aten._to_copy.default, aten.slice.Tensor, aten.select.int, aten.sum.dim_IntList, aten.sum.default,
    aten.neg.default, aten.add.Tensor, aten.sub.Tensor, aten.cat.default, aten.as_strided.default,
))


def without_absent_tangents(backward: torch.fx.GraphModule, num_tangents: int,
                            absent: frozenset[int]) -> torch.fx.GraphModule | None:
    """A copy of `backward` in which values computed only from the `absent` tangents are zeros; None
    when the graph, fed zero tangents, already computes what eager does."""
    placeholders = list(backward.graph.find_nodes(op="placeholder"))
    tangents = placeholders[len(placeholders) - num_tangents:]
    absent_nodes = {tangents[k] for k in absent}
    present_nodes = {t for k, t in enumerate(tangents) if k not in absent}
    only_absent, exact_zero = _absent_only(backward.graph, absent_nodes, present_nodes)
    frontier = [n for n in only_absent if n not in exact_zero and isinstance(n.meta.get("val"), torch.Tensor)
                and any(u not in only_absent for u in n.users)]
    if not frontier:
        return None
    graph = torch.fx.Graph()
    copies: dict = {}
    graph.output(graph.graph_copy(backward.graph, copies))
    unchanged_users = {copies[n] for n in only_absent}
    for old in frontier:
        node = copies[old]
        with graph.inserting_after(node):
            zeros = graph.call_function(aten.zeros_like.default, (node,))
        zeros.meta["val"] = torch.zeros_like(node.meta["val"])
        # Users that also depend on a present tangent (and outputs) read the zeros. The value is still
        # computed (zeros_like reads its shape), but no present gradient reads its data any more.
        node.replace_all_uses_with(
            zeros, delete_user_cb=lambda user, zeros=zeros: user not in unchanged_users and user is not zeros)
    eliminate_dead_code(graph)
    return graph_module(backward, graph)


def _absent_only(graph: torch.fx.Graph, absent: set, present: set) -> tuple[set, set]:
    """The nodes that depend on an absent tangent and on no present one; those of them exactly zero."""
    reaches_present = set(present)
    only_absent, exact_zero = set(), set(absent)
    for node in graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        inputs = node.all_input_nodes
        if any(a in reaches_present for a in inputs):
            reaches_present.add(node)
        elif any(a in absent or a in only_absent for a in inputs):
            only_absent.add(node)
            tensor_inputs = [a for a in inputs if isinstance(a.meta.get("val"), torch.Tensor)]
            if node.target in _ZERO_PRESERVING and all(a in exact_zero for a in tensor_inputs):
                exact_zero.add(node)
    return only_absent | absent, exact_zero


class BackwardVariants:
    """The compiled backward for each set of absent tangents a backward call meets, compiled on first use.

    The full backward (no tangent absent) is compiled up front unless `lazy`: a forward compiled while
    compiled autograd is on has its backward's ATen ops inlined into the captured backward graph
    (`traced_backward`), so its own compiled backward runs only where that does not apply, and is built then.
    """

    def __init__(self, graph: torch.fx.GraphModule, num_tangents: int,
                 compile_graph: Callable[[torch.fx.GraphModule], Callable], lazy: bool = False):
        self.graph, self.num_tangents, self.compile_graph = graph, num_tangents, compile_graph
        self.compiled: dict[frozenset[int], Callable] = {}
        if not lazy:
            self.compiled[frozenset()] = compile_graph(graph)

    def __call__(self, absent: frozenset[int]) -> Callable:
        try:
            return self.compiled[absent]
        except KeyError:
            return build_once(self.compiled, absent, self._build, absent)

    def graph_for(self, absent: frozenset[int]) -> torch.fx.GraphModule:
        """The (uncompiled) ATen backward graph for a set of absent tangents."""
        if not absent:
            return self.graph
        rewritten = without_absent_tangents(self.graph, self.num_tangents, absent)
        return self.graph if rewritten is None else rewritten

    def _build(self, absent: frozenset[int]) -> Callable:
        if not absent:
            return self.compile_graph(self.graph)
        rewritten = without_absent_tangents(self.graph, self.num_tangents, absent)
        return self(frozenset()) if rewritten is None else self.compile_graph(rewritten)
