"""Common-subexpression elimination for the kernel printers of both targets."""
from __future__ import annotations


class Scope:
    """The CSE cache of one block of generated code: structurally equal expressions are computed once.

    A nested block starts from its parent's entries: a value computed outside is visible
    inside, one computed inside is not visible after the block.
    """

    def __init__(self, parent: Scope | None = None):
        self.cache = dict(parent.cache) if parent else {}

    def lookup(self, e) -> tuple:
        """(the key to store `e`'s variable under, the variable already computed for it or None).

        Expressions are keyed by value; an unhashable one by its identity.
        """
        try:
            return e, self.cache.get(e)
        except TypeError:
            return id(e), self.cache.get(id(e))
