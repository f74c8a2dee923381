"""Functional collectives in an ATen graph: issued as early, and waited for as late, as dependencies allow.

A functional collective (`_c10d_functional.all_reduce`, `all_gather_into_tensor`, `reduce_scatter_tensor`,
...) starts the communication and returns a tensor that is valid only once `_c10d_functional.wait_tensor`
has run on it. Both run as extern calls into c10d. What runs between the start and the wait overlaps the
communication, so `place_collectives` moves each start up to just after its inputs and each wait down to
just before its first user; the scheduler keeps extern calls in graph order and fuses independent compute
around them. Collectives keep their relative order: every rank must issue them in the same order.
"""
from __future__ import annotations

import torch
import torch.fx

_NAMESPACE = "_c10d_functional"


def is_wait(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target.namespace == _NAMESPACE \
        and target.__name__.startswith("wait_tensor")


def is_collective_start(target) -> bool:
    """A functional collective that starts communication (every `_c10d_functional` op but the wait)."""
    return isinstance(target, torch._ops.OpOverload) and target.namespace == _NAMESPACE and not is_wait(target)


def place_collectives(gm: torch.fx.GraphModule) -> bool:
    """Reorder `gm` in place (starts early, waits late); whether it holds a collective."""
    graph = gm.graph
    starts = [n for n in graph.nodes if n.op == "call_function" and is_collective_start(n.target)]
    if not starts:
        return False
    previous = list(graph.find_nodes(op="placeholder"))[-1:]  # the last placeholder, if any
    for start in starts:
        position = {node: i for i, node in enumerate(graph.nodes)}
        anchors = [*start.all_input_nodes, *previous]
        if anchors:
            max(anchors, key=position.__getitem__).append(start)
        previous = [start]
    for wait in [n for n in graph.nodes if n.op == "call_function" and is_wait(n.target)]:
        position = {node: i for i, node in enumerate(graph.nodes)}
        first_user = min(wait.users, key=position.__getitem__, default=None)
        if first_user is not None:
            first_user.prepend(wait)
    graph.lint()
    gm.recompile()
    return True
