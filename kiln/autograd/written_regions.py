"""Functionalization of the nodes on written storages alone, the rest of the graph copied as it is.

Where `functionalize` cannot rewrite a graph's writes without tracing (a tensor written through views of
several geometries: an encoder-decoder's decoder input, `shifted[:, 1:] = ids[:, :-1]; shifted[:, 0] = start;
shifted.masked_fill_(...)`), it re-traced the whole joint graph through `torch.func.functionalize`: every op run
once more on fake tensors for three writes into one small tensor (3.5 s of a 6,000-node BART training graph).

Functionalization changes only what touches a written storage: the nodes whose values live on it (its
allocation, its views, the writes) and what their readers read. Here those nodes alone make a graph that is
re-traced through `torch.func.functionalize`, and each read of one of their values by another node (or by the
output) is a `clone` at the reader's place in it: functionalization records there the value the reader sees
(a view replayed from the storage's latest value); a clone of a value in a functional graph is that value, so
the reader reads the clone's argument. Each node the re-trace records is placed where the node whose
interpretation recorded it was (`_Positions`), so the graph keeps eager's order of ops (random ops included).

Only storages the graph allocates: a written graph input (or constant) needs the copy-back functionalization
appends, and stays with the whole re-trace, as do graphs with symbolic sizes or values functionalization reads
that are not fake tensors of one mode.
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from kiln.autograd.storages import storage_of
from kiln.effects import written_arguments
from kiln.runtime.lazy_graphs import copied_constant, module_with_constants
from kiln.runtime.symbolic_sizes import has_static_geometry

aten = torch.ops.aten


def functionalize_written_region(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, torch.fx.Graph] | None:
    """(root, graph): the graph `make_fx(functionalize(gm))` computes, with only the nodes on written storages
    re-traced; None where the module docstring's conditions do not hold."""
    nodes = list(gm.graph.nodes)
    region = _region(nodes)
    if region is None:
        return None
    sub, inputs, positions = _region_graph(nodes, region)
    values = [n.meta["val"] for n in inputs]
    modes = {v.fake_mode for v in values}
    if len(modes) != 1:
        return None
    marks: list[tuple[int, int]] = []
    interpreter = _Positions(module_with_constants(gm, sub, {}), positions, marks)
    with modes.pop(), torch.no_grad(), torch._C._DisableAutocast():
        traced = make_fx(torch.func.functionalize(interpreter.run, remove="mutations"))(*values)
    traced_nodes = list(traced.graph.nodes)
    if not marks or marks[-1][1] != len(traced_nodes) - 1:  # nodes recorded outside any op: not placed
        return None
    return _spliced(gm, nodes, region, inputs, traced, _placed(traced_nodes, marks))


def _region(nodes: list[torch.fx.Node]) -> set[torch.fx.Node] | None:
    """The nodes whose values live on a storage some op of the graph writes, or None where the region cannot be
    re-traced alone (see the module docstring)."""
    writes = {node: arguments for node in nodes if (arguments := _written_arguments(node))}
    written = set()
    for arguments in writes.values():
        for argument in arguments:
            value = argument.meta.get("val") if isinstance(argument, torch.fx.Node) else None
            if not isinstance(value, FakeTensor):
                return None
            written.add(storage_of(value))
    if not written:
        return None
    region = set()
    for node in nodes:
        leaves = [v for v in pytree.tree_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)]
        if not any(storage_of(v) in written for v in leaves) and node not in writes:
            continue
        if node.op != "call_function" or len(leaves) != 1 or not isinstance(node.meta["val"], FakeTensor) \
                or not has_static_geometry(node.meta["val"]):
            return None  # a written input or constant, an op of several results (or none), symbolic sizes
        region.add(node)
    for node in region:
        for argument in node.all_input_nodes:
            value = argument.meta.get("val")
            if not isinstance(value, FakeTensor) or not has_static_geometry(value):
                return None
    return region



def _written_arguments(node: torch.fx.Node) -> list:
    """The arguments an op of `node` writes, by its schema (`self` of `add_`, `out` of `add.out`)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
            or not node.target._schema.is_mutable:
        return []
    found = []
    for value in written_arguments(node.target._schema, node.args, node.kwargs):
        found += pytree.tree_leaves(value) if value is not None else [value]
    return found


def _region_graph(nodes: list[torch.fx.Node], region: set) -> tuple[torch.fx.Graph, list, dict]:
    """(the region's graph, the outside nodes it reads as its inputs in order, each of its nodes' position in
    `nodes`). Its outputs are the clones of region values at each outside reader's position, in reading order."""
    sub, inputs, env, positions, reads = torch.fx.Graph(), [], {}, {}, []

    def read(n: torch.fx.Node) -> torch.fx.Node:
        if n not in env:
            inputs.append(n)
            env[n] = sub.placeholder(n.name)
            env[n].meta["val"] = n.meta["val"]
        return env[n]

    for node in (n for n in nodes if n in region):
        for argument in node.all_input_nodes:
            if argument not in region:
                read(argument)
    for position, node in enumerate(nodes):
        if node in region:
            env[node] = sub.node_copy(node, env.__getitem__)
            positions[env[node]] = position
            continue
        for argument in node.all_input_nodes:
            if argument in region:
                clone = sub.call_function(aten.clone.default, (env[argument],))
                positions[clone] = position
                reads.append(clone)
    sub.output(reads)
    return sub, inputs, positions


class _Positions(torch.fx.Interpreter):
    """Runs the region's graph, noting after each node how many nodes the trace has recorded, with the position
    in the whole graph of the node that recorded them."""

    def __init__(self, module: torch.fx.GraphModule, positions: dict, marks: list):
        super().__init__(module)
        self.positions, self.marks = positions, marks

    def run_node(self, n: torch.fx.Node):
        result = super().run_node(n)
        if n in self.positions:
            self.marks.append((self.positions[n], len(get_proxy_mode().tracer.graph.nodes)))
        return result


def _placed(traced_nodes: list, marks: list[tuple[int, int]]) -> dict[torch.fx.Node, int]:
    """Each recorded op's position: that of the region node (or outside reader) whose run recorded it."""
    placed, start = {}, 0
    for position, end in marks:
        for node in traced_nodes[start:end]:
            if node.op == "call_function" or node.op == "get_attr":
                placed[node] = position
        start = max(start, end)
    return placed


def _spliced(gm, nodes, region, inputs, traced, placed) -> tuple[torch.fx.GraphModule, torch.fx.Graph]:
    """The whole graph: the outside nodes copied, each recorded op at its place, readers reading the values
    the re-trace recorded for them."""
    graph, env, local, constants = torch.fx.Graph(), {}, {}, {}
    outside_of = dict(zip(traced.graph.find_nodes(op="placeholder"), inputs))
    output = next(iter(traced.graph.find_nodes(op="output")))
    seen_by = iter(output.args[0])  # one value per outside read, in reading order
    by_position: dict[int, list] = {}
    for node, position in placed.items():
        by_position.setdefault(position, []).append(node)

    def new(recorded: torch.fx.Node) -> torch.fx.Node:
        return env[outside_of[recorded]] if recorded in outside_of else local[recorded]

    def emit(position: int) -> None:
        for recorded in by_position.get(position, ()):
            if recorded.op == "get_attr":
                name = f"_functionalized_{len(constants)}"
                local[recorded] = copied_constant(graph, traced, recorded, constants, name)
            else:
                local[recorded] = graph.node_copy(recorded, new)

    for position, node in enumerate(nodes):
        emit(position)
        if node in region:
            continue
        reads = {}
        for argument in node.all_input_nodes:
            if argument in region:
                clone = next(seen_by)
                reads[argument] = new(clone.args[0] if clone.target is aten.clone.default else clone)
        env[node] = graph.node_copy(node, lambda n, reads=reads: reads[n] if n in reads else env[n])
    return module_with_constants(gm, graph, constants), graph
