"""Common-subexpression elimination for the kernel printers of both targets."""
from __future__ import annotations


class Scope:
    """The CSE cache of one block of generated code: structurally equal expressions are computed once.

    A nested block starts from its parent's entries: a value computed outside is visible
    inside, one computed inside is not visible after the block.
    """

    def __init__(self, parent: Scope | None = None):
        self.cache = dict(parent.cache) if parent else {}

    def lookup(self, e, generation: int = 0) -> tuple:
        """(the key to store `e`'s variable under, the variable already computed for it or None).

        Expressions are keyed by value; an unhashable one by its identity. `generation` counts the stores
        into buffers the kernel also reads as inputs (kiln/schedule/input_writes.py): a load of one reads
        another value after such a store, so nothing computed before it is reused after it.
        """
        key = e if generation == 0 else (e, generation)
        try:
            return key, self.cache.get(key)
        except TypeError:
            key = (id(e), generation)
            return key, self.cache.get(key)
