"""Sources: where a value the graph depends on lives, written as a Python expression.

A guard reads `source.expr()` to check a value on the next call; the output
program reads it to fetch a graph input or to replay a side effect. Expressions
are evaluated with `L` (the frame's inputs: arguments, or stack and locals for a
continuation) and `G` (the function's globals) in scope.
"""
from __future__ import annotations

from dataclasses import dataclass


class Source:
    def expr(self) -> str:
        raise NotImplementedError

    def name(self) -> str:
        """A short identifier for graph placeholder names: L['self'].fc1.weight -> self_fc1_weight."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.expr()


@dataclass(frozen=True)
class LocalSource(Source):
    local: str

    def expr(self) -> str:
        return f"L[{self.local!r}]"

    def name(self) -> str:
        return self.local


@dataclass(frozen=True)
class GlobalSource(Source):
    global_name: str

    def expr(self) -> str:
        return f"G[{self.global_name!r}]"

    def name(self) -> str:
        return self.global_name


@dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    attr: str

    def expr(self) -> str:
        if self.attr.isidentifier():
            return f"{self.base.expr()}.{self.attr}"
        return f"getattr({self.base.expr()}, {self.attr!r})"

    def name(self) -> str:
        return f"{self.base.name()}_{self.attr}"


@dataclass(frozen=True)
class ItemSource(Source):
    base: Source
    key: object  # an int, str or other literal with a faithful repr

    def expr(self) -> str:
        return f"{self.base.expr()}[{self.key!r}]"

    def name(self) -> str:
        return f"{self.base.name()}_{self.key}"


@dataclass(frozen=True)
class ClosureSource(Source):
    """The contents of a closure cell of the compiled function: `C[i].cell_contents`."""

    index: int
    var: str

    def expr(self) -> str:
        return f"C[{self.index}].cell_contents"

    def name(self) -> str:
        return self.var


@dataclass(frozen=True)
class ConstantSource(Source):
    """An object kiln put in the program's namespace under `key` (a module object, a class)."""

    key: str

    def expr(self) -> str:
        return self.key

    def name(self) -> str:
        return self.key.strip("_")
