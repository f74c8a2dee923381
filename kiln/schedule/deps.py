"""Dependencies between IR nodes: which buffers each node reads, and at which indices."""
from __future__ import annotations

from collections import defaultdict

from kiln.lower import ir


def body_loads(node: ir.ComputedBuffer) -> list[ir.Load]:
    return ir.loads(node.data.body)


def reads(node: ir.Node) -> set[str]:
    """Names of the buffers `node` reads."""
    if isinstance(node, ir.ComputedBuffer):
        return {ld.buf for ld in body_loads(node)}
    return ir.extern_reads(node)


def readers(graph: ir.LoweredGraph) -> dict[str, list[ir.Node]]:
    """buffer name -> nodes reading it (graph outputs are not nodes; see `output_buffers`)."""
    out = defaultdict(list)
    for n in graph.nodes:
        for b in reads(n):
            out[b].append(n)
    return out


def output_buffers(graph: ir.LoweredGraph) -> set[str]:
    return {o.buf for o in graph.outputs if isinstance(o, ir.TensorRef)}
