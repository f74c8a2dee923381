"""The table the lowering rules register into: ATen op overload -> rule.

Kept apart from the package's `__init__` (which imports every rule module to fill it) so that a
rule module imports the table without importing its own package's `__init__` in a cycle.
"""
from __future__ import annotations

from collections.abc import Callable

LOWERINGS: dict = {}


def register(*ops) -> Callable:
    """Register `fn` as the rule of each OpOverload in `ops`."""

    def deco(fn: Callable) -> Callable:
        for op in ops:
            LOWERINGS[op] = fn
        return fn

    return deco
