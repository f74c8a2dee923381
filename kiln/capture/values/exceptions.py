"""Python exceptions raised and caught inside traced code.

Library code uses exceptions for control flow: `Mapping.get` is
`try: return self[key] except KeyError: return default`. When traced code raises
an exception whose type capture knows (a `raise` statement, or a KeyError /
IndexError / AttributeError kiln's own trackers raise where Python would), it
travels as a `TracedException`: the interpreter unwinds to the innermost
`try` handler of the current frame, or of the frames it was inlined from, and
runs the handler. An exception no traced handler catches stays what it was
before: a graph break of reason "exception" (the instruction then runs natively
and raises for real).
"""
from __future__ import annotations

from typing import Any

from kiln.capture.breaks import GraphBreak
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue


class ExceptionValue(Value):
    """An exception instance made during capture: its class and constructor arguments."""

    def __init__(self, cls: type, args: list[Value]):
        self.cls, self.args = cls, list(args)
        self.raised_at = None  # the root frame's instruction that raised it (a graph break goes there)

    def python_type(self) -> type:
        return self.cls

    def as_constant(self) -> BaseException:
        """An equal exception of a builtin class with constant arguments, for what reads it as a value
        (`str(e)`, `repr(e)`); other classes may run code of their own, so capture does not make them."""
        if self.cls.__module__ != "builtins":
            return super().as_constant()
        return self.cls(*(a.as_constant() for a in self.args))

    def getattr(self, state, name: str) -> Value:
        from kiln.capture.values.containers import TupleValue

        if name == "args":
            return TupleValue(self.args)
        if name in ("__traceback__", "__cause__", "__context__"):
            return ConstantValue(None)
        raise GraphBreak("unsupported_object", f"attribute {name!r} of a {self.cls.__name__}")

    def setattr(self, state, name: str, value: Value) -> None:
        """`exc.__traceback__ = tb` (contextlib's `__exit__` does so): traced exceptions carry no traceback."""
        if name != "__traceback__" or not (value.is_constant() and value.as_constant() is None):
            raise GraphBreak("unsupported_object", f"setting {name!r} of a {self.cls.__name__}")

    def message(self) -> str:
        try:
            return str(self.cls(*(a.as_constant() for a in self.args)))
        except Exception:
            return self.cls.__name__

    def reconstruct(self, writer) -> str:
        return f"{writer.constant(self.cls)}({', '.join(a.reconstruct(writer) for a in self.args)})"

    def __repr__(self) -> str:
        return f"Exception({self.cls.__name__})"


class TracedException(GraphBreak):
    """A Python exception raised by traced code; a traced `try` may catch it (see the module docstring)."""

    def __init__(self, value: ExceptionValue):
        self.value = value
        super().__init__("exception", f"{value.cls.__name__}: {value.message()}")


def raise_python(cls: type, *args: Any) -> TracedException:
    """The exception Python would raise here (`raise raise_python(KeyError, key)`), catchable by traced code."""
    return TracedException(ExceptionValue(cls, [ConstantValue(a) for a in args]))


def python_error(e: Exception, what: str) -> GraphBreak:
    """The break for exception `e` that Python itself raised while capture replayed an operation on constants
    (`len(5)`, `'ab'[9]`, `int('x')`): the very exception eager raises at that point, so a traced `try` or
    `with suppress(...)` handles it. An exception of a class defined outside the builtins (it may carry state
    capture cannot rebuild) stays a plain break, and the operation runs natively."""
    if type(e).__module__ == "builtins" and is_exception_class(type(e)):
        return TracedException(ExceptionValue(type(e), [ConstantValue(a) for a in e.args]))
    return GraphBreak("exception", f"{what} raised {type(e).__name__}: {e}")


def is_exception_class(cls: Any) -> bool:
    """Exception classes capture can make without running code: builtin ones and subclasses keeping their __init__."""
    return isinstance(cls, type) and issubclass(cls, BaseException) and all(
        "__init__" not in k.__dict__ and "__new__" not in k.__dict__ for k in cls.__mro__ if k.__module__ != "builtins")
