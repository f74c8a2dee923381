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
zero tangent already makes them zero.

Where such an exact zero is summed into a present gradient (`add(zero, g)`, the accumulation
of two outputs' contributions), the sum is `g` itself, as eager, which never adds a gradient it
never computed: the sum is not exact at every value (`0.0 + -0.0` is `+0.0`; a complex add
scales by `alpha` as a complex product, and `inf + 0j` picks up a NaN imaginary part that a
later complex product carries into the real one). When nothing needs a rewrite (no zeros to
put in, no complex sum: a real one changes at most a zero's sign) the graph is used as it is,
with no second compile.
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
    sums = {n: kept for n in backward.graph.nodes if n not in only_absent
            for kept in [_summed_with_zero(n, only_absent)] if kept is not None}
    if not frontier and not any(n.meta["val"].dtype.is_complex for n in sums):
        return None  # a real sum differs only in a zero's sign: not worth a second compile of the backward
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
    for total, (gradient, negated) in sums.items():
        node, kept = copies[total], copies[gradient]
        if negated:
            with graph.inserting_after(node):
                kept = graph.call_function(aten.neg.default, (kept,))
            kept.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(kept)
    eliminate_dead_code(graph)
    return graph_module(backward, graph)


def _summed_with_zero(node: torch.fx.Node, zero: set) -> tuple[torch.fx.Node, bool] | None:
    """For `add(a, b)` or `sub(a, b)` (alpha 1) where one operand is computed only from absent tangents (`zero`:
    an exact zero, or zeros once rewritten) and the other a value of the result's shape and dtype: (that value,
    whether the result is its negation, `0 - b`); else None."""
    if node.target not in (aten.add.Tensor, aten.sub.Tensor) or node.kwargs.get("alpha", 1) != 1 or len(node.args) != 2:
        return None
    a, b = node.args
    if not all(isinstance(x, torch.fx.Node) for x in (a, b)) or (a in zero) == (b in zero):
        return None
    kept = b if a in zero else a
    result, value = node.meta.get("val"), kept.meta.get("val")
    if not (isinstance(result, torch.Tensor) and isinstance(value, torch.Tensor) and result.dtype == value.dtype
            and list(map(str, result.shape)) == list(map(str, value.shape))):
        return None  # a broadcast or a promotion: the sum is not the value as it is
    return kept, node.target is aten.sub.Tensor and kept is b


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
