"""The autograd nodes behind tensors: walked by what reads a history (the leaves it accumulates into, the values
its nodes saved, the hooks a None handed down it reaches)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator


def reachable_nodes(roots: Iterable) -> Iterator:
    """Every autograd node reachable from the nodes `roots` (None among them skipped), each once, depth first
    from the last root; iterative, since autograd graphs run deep."""
    seen, stack = set(), [r for r in roots if r is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(child for child, _ in node.next_functions if child is not None and child not in seen)
