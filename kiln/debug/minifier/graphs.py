"""Graph surgery for the minifier: a failing graph and its inputs, and the smaller candidates made from them.

A `Case` is a GraphModule whose only inputs are placeholders (tensor attributes are lifted into inputs first)
and the values fed to them. Every candidate is built the same way, by `Case.rebuild`: some nodes become new
placeholders fed with the value eager computes for them (a subgraph replaced by its inputs), the graph
returns chosen nodes (outputs cut), and what no output needs is dropped. `bypass` removes one node by
routing its users to an input of the same shape and dtype; `shrink` slices every tensor input smaller.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from kiln.effects import eliminate_dead_code

COMPUTE = ("call_function", "call_method", "call_module")


@dataclass
class Case:
    gm: torch.fx.GraphModule
    inputs: list

    @property
    def compute_nodes(self) -> list[torch.fx.Node]:
        return [n for n in self.gm.graph.nodes if n.op in COMPUTE]

    @property
    def size(self) -> tuple[int, int]:
        """What the minifier makes smaller: the compute nodes first, then the elements of the inputs."""
        return len(self.compute_nodes), sum(t.numel() for t in self.inputs if isinstance(t, torch.Tensor))

    def outputs(self) -> list[torch.fx.Node]:
        out = next(iter(self.gm.graph.find_nodes(op="output")))
        return [a for a in torch.utils._pytree.tree_leaves(out.args[0]) if isinstance(a, torch.fx.Node)]

    def values(self) -> dict[torch.fx.Node, Any]:
        """Every node's value, computed eagerly on the inputs (grad off: only values are needed)."""
        env: dict[torch.fx.Node, Any] = {}

        class Recorder(torch.fx.Interpreter):
            def run_node(self, n):
                env[n] = super().run_node(n)
                return env[n]

        with torch.no_grad():
            Recorder(self.gm).run(*[_detached_clone(a) for a in self.inputs])
        return env

    def rebuild(self, outputs: list[torch.fx.Node], as_inputs: set[torch.fx.Node] = frozenset(),
                values: dict | None = None) -> Case:
        """The graph that returns `outputs`, with each node of `as_inputs` a placeholder fed its eager value."""
        values = values if values is not None else (self.values() if as_inputs else {})
        needed = _ancestors(outputs, as_inputs)
        graph = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        inputs = []
        placeholders = {n: i for i, n in enumerate(self.gm.graph.find_nodes(op="placeholder"))}
        for node in self.gm.graph.nodes:  # placeholders first, in graph order: the old ones, then the new ones
            if node in needed and (node in placeholders or node in as_inputs):
                env[node] = graph.placeholder(node.name)
                env[node].meta = dict(node.meta)
                value = self.inputs[placeholders[node]] if node in placeholders else values[node]
                if node in as_inputs and isinstance(value, torch.Tensor):
                    value = value.detach().clone()
                inputs.append(value)
        for node in self.gm.graph.nodes:
            if node in needed and node not in env:
                env[node] = graph.node_copy(node, lambda n: env[n])
        graph.output(tuple(env[n] for n in outputs))
        return Case(_module(self.gm, graph), inputs)

    def truncated(self, k: int) -> Case:
        """The graph cut after its k-th compute node, returning the tensors nothing after them reads."""
        kept = self.compute_nodes[:k]
        kept_set = set(kept)
        values = self.values()
        leaves = [n for n in kept if isinstance(values.get(n), torch.Tensor)
                  and not any(u in kept_set for u in n.users)]
        return self.rebuild(leaves or kept[-1:])

    def bypassed(self, node: torch.fx.Node) -> Case | None:
        """The graph without `node`: its users read an input of `node` with the same shape and dtype instead.
        None if it has no such input."""
        values = self.values()
        value = values.get(node)
        if not isinstance(value, torch.Tensor):
            return None
        same = [a for a in node.all_input_nodes if isinstance(values.get(a), torch.Tensor)
                and values[a].shape == value.shape and values[a].dtype == value.dtype]
        if not same:
            return None
        graph = torch.fx.Graph()
        env: dict[torch.fx.Node, torch.fx.Node] = {}
        for n in self.gm.graph.nodes:
            env[n] = env[same[0]] if n is node else graph.node_copy(n, lambda a: env[a])
        gm = _module(self.gm, graph)
        eliminate_dead_code(gm.graph)
        return Case(gm, list(self.inputs)).without_unused_inputs()

    def without_unused_inputs(self) -> Case:
        return self.rebuild(self.outputs())

    def shrunk(self, which: set[int] | None = None, to_one: bool = False) -> Case | None:
        """Each tensor input (those in `which`, by position) sliced to half its size (`to_one`: to size 1) in every
        dimension above 1; None if none can shrink."""
        inputs, changed = [], False
        for i, t in enumerate(self.inputs):
            if isinstance(t, torch.Tensor) and (which is None or i in which) and any(s > 1 for s in t.shape):
                index = tuple(slice(0, 1 if to_one else max(1, s // 2)) for s in t.shape)
                small = t.detach()[index]
                layout = torch.contiguous_format if t.is_contiguous() else torch.preserve_format
                small = small.clone(memory_format=layout)
                inputs.append(small.requires_grad_(t.requires_grad) if small.is_floating_point() else small)
                changed = True
            else:
                inputs.append(t)
        return Case(self.gm, inputs) if changed else None


def lifted(gm: torch.fx.GraphModule, inputs: list) -> Case:
    """`gm` with its tensor attributes (parameters, buffers, constants) read as inputs, so that every value the
    minifier may cut or shrink is an input, and the written script needs no module state."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    attributes = [n for n in gm.graph.nodes
                  if n.op == "get_attr" and isinstance(operator.attrgetter(n.target)(gm), torch.Tensor)]
    values = list(inputs)
    for node in gm.graph.find_nodes(op="placeholder"):
        env[node] = graph.node_copy(node)
    for node in attributes:
        env[node] = graph.placeholder(node.name)
        value = operator.attrgetter(node.target)(gm)
        values.append(value.detach().clone().requires_grad_(value.requires_grad))
    for node in gm.graph.nodes:
        if node not in env:
            env[node] = graph.node_copy(node, lambda n: env[n])
    return Case(_module(gm, graph), values)


def _ancestors(outputs: list[torch.fx.Node], stops: set[torch.fx.Node]) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    todo = list(outputs)
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node not in stops:
            todo.extend(node.all_input_nodes)
    return seen


def _module(root: torch.fx.GraphModule, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    gm = torch.fx.GraphModule(root, graph)
    meta = getattr(root, "meta", {})
    gm.meta = {k: v for k, v in meta.items() if k != "kiln.graph_id"}  # a candidate is not the user's graph N
    return gm


def _detached_clone(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value
