"""Python values capture knows exactly: numbers, strings, None, dtypes, devices, slices.

Operations on constants fold at capture time; the graph never sees them. A
constant read from the user's world (an int argument, a global flag) was
guarded by value when it was wrapped, so folding it is safe.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.capture.breaks import GraphBreak
from kiln.capture.values.base import Value

LITERAL_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), type(NotImplemented))
CONSTANT_TYPES = LITERAL_TYPES + (torch.dtype, torch.device, torch.layout, torch.memory_format, slice, range,
                                  torch.Size, frozenset, type)


def _plain(value: Any) -> Any:
    """A size that a guard made constant (a SymInt whose expression is now a number, or a torch.Size of
    them) as the plain int eager has: a constant flows into Python state, where eager never has a SymInt."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)](value)
    if type(value) is torch.Size and any(isinstance(n, torch.SymInt) for n in value):
        return torch.Size(int(n) for n in value)
    return value


def is_literal(obj: Any) -> bool:
    """True for values whose repr() rebuilds them (nested in tuples too)."""
    if isinstance(obj, (tuple, frozenset)) and type(obj) in (tuple, frozenset):
        return all(is_literal(o) for o in obj)
    if type(obj) is float:  # not a subclass (numpy's float64 prints as np.float64(...))
        return obj == obj and obj not in (float("inf"), float("-inf"))
    return type(obj) in LITERAL_TYPES


class ConstantValue(Value):
    def __init__(self, value: Any, source=None):
        self.value, self.source = _plain(value), source

    def python_type(self) -> type:
        return type(self.value)

    def as_constant(self) -> Any:
        return self.value

    def is_constant(self) -> bool:
        return True

    def getattr(self, state, name: str) -> Value:
        try:
            attr = getattr(self.value, name)
        except AttributeError as e:
            from kiln.capture.values.exceptions import raise_python

            raise raise_python(AttributeError, f"{type(self.value).__name__} has no attribute {name!r}") from e
        if callable(attr):
            from kiln.capture.values.functions import BuiltinValue

            return BuiltinValue(attr)
        return ConstantValue(attr)

    def getitem(self, state, key: Value) -> Value:
        return ConstantValue(self.value[key.as_constant()])

    def unpack(self, state) -> list[Value]:
        try:
            return [ConstantValue(v) for v in self.value]
        except TypeError as e:
            raise GraphBreak("exception", str(e)) from e

    def length(self, state) -> int:
        return len(self.value)

    def reconstruct(self, writer) -> str:
        if self.source is not None:
            return writer.source_expr(self.source)
        return writer.constant(self.value)

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"
