"""Python values capture knows exactly: numbers, strings, None, dtypes, devices, slices.

Operations on constants fold at capture time; the graph never sees them. A
constant read from the user's world (an int argument, a global flag) was
guarded by value when it was wrapped, so folding it is safe.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.breaks import GraphBreak
from kiln.capture.values.base import Value

LITERAL_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis), type(NotImplemented))
# torch's immutable descriptor objects: arguments of torch functions, compared by value (memory formats and
# layouts are singletons)
TORCH_DESCRIPTORS = (torch.dtype, torch.device, torch.layout, torch.memory_format)
CONSTANT_TYPES = LITERAL_TYPES + TORCH_DESCRIPTORS + (slice, range, torch.Size, frozenset, type)


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
        try:
            return ConstantValue(self.value[key.as_constant()])
        except Exception as e:
            raise _python_error(e, "[]") from e

    def unpack(self, state) -> list[Value]:
        try:
            return [ConstantValue(v) for v in self.value]
        except Exception as e:
            raise _python_error(e, "iter()") from e

    def length(self, state) -> int:
        try:
            return len(self.value)
        except Exception as e:
            raise _python_error(e, "len()") from e

    def reconstruct(self, writer) -> str:
        if self.source is not None:
            return writer.source_expr(self.source)
        return writer.constant(self.value)

    def __repr__(self) -> str:
        return f"Constant({self.value!r})"


def _python_error(e: Exception, what: str) -> GraphBreak:
    from kiln.capture.values.exceptions import python_error  # exceptions builds on this module

    return python_error(e, what)


class ScalarInputValue(ConstantValue):
    """An int or float read from the user's world (an argument, a value a continuation receives after `.item()`),
    guarded by how it is used: its type at once, its exact value only when capture relies on the value.

    A comparison with a constant (`if n > 0:`) relies on the outcome only: `compare` guards `n > 0` itself, so
    the next value on the same side of the branch reuses the entry instead of recompiling for every value.
    Anything else that reads the value (arithmetic, a size, a format) specializes on it with `==`.
    """

    def __init__(self, value: Any, source, guard_value: Callable[[], None], as_tensor: Callable | None = None,
                 origin: tuple | None = None):
        super().__init__(value, source)
        # (source, value) of the frame's input it is or is computed from (`n % 2`), whose change between calls
        # makes it a symbol (automatic dynamic); None for a number of a module, a global or a closure
        self.origin = origin
        self._guard_value = guard_value
        self._as_tensor, self._tensor = as_tensor, None

    def graph_tensor(self, partner: torch.Tensor) -> Value | None:
        """This float as a graph input (a 0-d float64 tensor, made once) for arithmetic with the (fake) tensor
        `partner`, where automatic dynamic made it one and the tensor promotes as the Python float would (a
        floating-point tensor); None where its value is specialized. (An int that changed is a symbol instead.)"""
        if self._as_tensor is None or not partner.is_floating_point():
            return None
        if self._tensor is None:
            self._tensor = self._as_tensor()
        return self._tensor

    def specialize(self) -> Any:
        if self._guard_value is not None:
            self._guard_value()
            self._guard_value = None
        return self.value

    def as_constant(self) -> Any:
        return self.specialize()

    def truth(self, state) -> bool:
        return bool(self.specialize())

    def getattr(self, state, name: str) -> Value:
        self.specialize()
        return super().getattr(state, name)

    def getitem(self, state, key: Value) -> Value:
        self.specialize()
        return super().getitem(state, key)

    def unpack(self, state) -> list[Value]:
        self.specialize()
        return super().unpack(state)

    def length(self, state) -> int:
        self.specialize()
        return super().length(state)

    def __repr__(self) -> str:
        return f"ScalarInput({self.value!r} at {self.source})"
