"""Decomposing the few nodes of a graph that need it, each traced alone and spliced in.

The code generator's decompose stage used to re-trace a whole graph through kiln's decomposition table when
any node of it decomposes: every op of the graph run once more on fake tensors. A graph that reaches the code
generator mostly decomposed already (the autograd stage traces with the same table) may hold a few such nodes:
a `select_scatter` that functionalization recorded for `ids[:, 0] = start` (the decoder input of an
encoder-decoder), in a forward graph of 3,000 nodes, cost its re-trace a second and a half. Here each such node's
op is traced alone on the fake values of its arguments, with the same table, and its graph takes the node's
place: the same nodes a whole re-trace records for it, the rest of the graph copied as it is.

A node whose trace alone could differ from the whole graph's re-trace is not spliced, and the caller re-traces
the whole graph: a node without a traced value, symbolic sizes (the re-trace would derive its sizes from the
graph's inputs), an argument that is not a tensor the graph computed, a tuple result read other than by its items.
"""
from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.runtime.lazy_graphs import copied_constant, module_with_constants
from kiln.runtime.symbolic_sizes import has_static_geometry

# meta of a graph's nodes that describes the traced value, which each spliced node has of its own
_VALUE_META = ("val", "tensor_meta")


def decompose_nodes(gm: torch.fx.GraphModule, decomposes: Callable[[torch.fx.Node], bool],
                    table: dict) -> torch.fx.GraphModule | None:
    """`gm` with each node for which `decomposes(node)` holds replaced by its op traced through `table`; `gm`
    itself where there is none, and None where a node cannot be traced alone (the module docstring)."""
    chosen = [n for n in gm.graph.nodes if n.op == "call_function" and decomposes(n)]
    if not chosen:
        return gm
    if not all(map(_traceable_alone, chosen)):
        return None
    chosen = set(chosen)
    graph, env, items, constants = torch.fx.Graph(), {}, {}, {}
    for node in gm.graph.nodes:
        if node in chosen:
            result = _splice(graph, node, env, table, constants)
            (items if isinstance(result, (tuple, list)) else env)[node] = result
        elif node.op == "call_function" and node.target is operator.getitem and node.args[0] in items:
            env[node] = items[node.args[0]][node.args[1]]
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
    return module_with_constants(gm, graph, constants)


def _traceable_alone(node: torch.fx.Node) -> bool:
    value = node.meta.get("val")
    values = value if isinstance(value, (tuple, list)) else [value]
    if not all(v is None or (isinstance(v, torch.Tensor) and has_static_geometry(v)) for v in values) or value is None:
        return False
    if isinstance(value, (tuple, list)) and not all(
            u.op == "call_function" and u.target is operator.getitem and isinstance(u.args[1], int)
            for u in node.users):
        return False
    arguments = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, torch.fx.Node)]
    if not arguments or not all(isinstance(a.meta.get("val"), FakeTensor) and has_static_geometry(a.meta["val"])
                                for a in arguments):
        return False
    return len({a.meta["val"].fake_mode for a in arguments}) == 1



def _splice(graph: torch.fx.Graph, node: torch.fx.Node, env: dict, table: dict, constants: dict):
    """Trace `node`'s op alone through `table` and copy its graph into `graph`; its result's node (a tuple of
    them for a tuple result)."""
    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    at = [k for k, leaf in enumerate(leaves) if isinstance(leaf, torch.fx.Node)]

    def op(*tensors):
        filled = list(leaves)
        for k, t in zip(at, tensors):
            filled[k] = t
        args, kwargs = pytree.tree_unflatten(filled, spec)
        return node.target(*args, **kwargs)

    values = [leaves[k].meta["val"] for k in at]
    with values[0].fake_mode:
        traced = make_fx(op, decomposition_table=table, tracing_mode="real")(*values)
    placeholders = iter(env[leaves[k]] for k in at)
    local: dict[torch.fx.Node, torch.fx.Node] = {}
    result = None
    for sub in traced.graph.nodes:
        if sub.op == "placeholder":
            local[sub] = next(placeholders)
        elif sub.op == "get_attr":
            local[sub] = copied_constant(graph, traced, sub, constants, f"_decomposed_{len(constants)}_{sub.target}")
        elif sub.op == "output":
            result = torch.fx.map_arg(sub.args[0], local.__getitem__)
        else:
            local[sub] = copied = graph.node_copy(sub, local.__getitem__)
            for key, meta in node.meta.items():  # where it came from: the node it replaces
                if key not in _VALUE_META:
                    copied.meta.setdefault(key, meta)
    return result
