"""Functionalization: in-place ops become pure ops, input mutations become outputs.

The traced ATen graph is re-traced through `torch.func.functionalize`, which
replaces each in-place op by its out-of-place form and, for a graph input that
was mutated, ends the graph with `aten.copy_(input, new_value)`. Those trailing
copies are then taken out of the graph: each `new_value` becomes an extra graph
output, and the runtime copies it into the real input after the call
(`InputMutation`). View ops stay views (`remove="mutations"`): the code
generator lowers them as index rewrites, and a view is cheaper than a copy.

Ops that mutate without a functional variant known to the functionalizer (the
batch-norm family writes its running statistics in place) are decomposed first,
during tracing (`decompositions.FUNCTIONALIZATION`). `verify_functional` checks
the result: no op of the final graph may have a mutable schema.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.autograd.signature import TensorSpec, symbolic_dispatch

aten = torch.ops.aten

@dataclass(frozen=True)
class InputMutation:
    """Graph output `output_index` is the new value of flat input `input_index`."""

    input_index: int
    output_index: int


def functionalize(gm: torch.fx.GraphModule, input_specs: list[TensorSpec],
                  mode: FakeTensorMode | None = None) -> tuple[torch.fx.GraphModule, list[InputMutation]]:
    """A functional copy of `gm`; input mutations are appended to its outputs.

    Traced in `mode` (a fresh fake mode by default; a dynamic-shape graph passes the one
    owning its symbols)."""
    mode = mode or FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [s.fake(mode) for s in input_specs]
    with mode, symbolic_dispatch(mode), torch.no_grad(), torch._C._DisableAutocast():  # casts are ops of `gm`
        fgm = make_fx(torch.func.functionalize(gm, remove="mutations"))(*fakes)
    mutations = _lift_input_mutations(fgm)
    _remove_identities(fgm)
    fgm.graph.eliminate_dead_code()
    fgm.recompile()
    verify_functional(fgm)
    return fgm, mutations


def _lift_input_mutations(gm: torch.fx.GraphModule) -> list[InputMutation]:
    """Turn the trailing `copy_(placeholder, value)` nodes into extra outputs."""
    graph = gm.graph
    placeholders = {n: i for i, n in enumerate(graph.find_nodes(op="placeholder"))}
    output = graph.find_nodes(op="output")[0]
    outs = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    mutations = []
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.copy_.default and node.args[0] in placeholders:
            if node.users:
                raise NotImplementedError("kiln: a graph that reads the result of copy_ into its input")
            mutations.append(InputMutation(placeholders[node.args[0]], len(outs)))
            outs.append(node.args[1])
            graph.erase_node(node)
    output.args = (outs,)
    return mutations


def _remove_identities(gm: torch.fx.GraphModule) -> None:
    """Drop ops that return their input's value unchanged: `detach`, `alias`, same-meta `copy`.

    Autograd's saved-variable unpacking leaves `detach` nodes in the joint graph and
    decompositions leave `copy(dst, src)` where `src` already has `dst`'s metadata;
    without autograd in the graph they only obscure what the partitioner sees.
    """
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (aten.detach.default, aten.alias.default):
            node.replace_all_uses_with(node.args[0])
        elif node.target is aten.copy.default:
            dst, src = node.args[0].meta.get("val"), node.args[1].meta.get("val")
            if (isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor) and dst.shape == src.shape
                    and dst.dtype == src.dtype and dst.device == src.device and dst.stride() == src.stride()):
                node.replace_all_uses_with(node.args[1])


def verify_functional(gm: torch.fx.GraphModule) -> None:
    """Raise if any op of `gm` can mutate its arguments."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target._schema.is_mutable:
                raise NotImplementedError(
                    f"kiln: {node.target} still mutates its input after functionalization (node {node.name})")
