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

import types
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
        if name == "__traceback__":
            return TracebackValue(self)
        if name in ("__cause__", "__context__"):
            return ConstantValue(None)
        raise GraphBreak("unsupported_object", f"attribute {name!r} of a {self.cls.__name__}")

    def setattr(self, state, name: str, value: Value) -> None:
        """`exc.__traceback__ = tb` with the traceback the exception already has (contextlib's generator
        managers' `__exit__` does so): nothing changes."""
        value = value.realize()
        keeps_its_own = isinstance(value, TracebackValue) and value.exception is self
        if name != "__traceback__" or not keeps_its_own:
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


class TracebackValue(Value):
    """The traceback of a traced exception (`exc.__traceback__`, the third argument of a `with` block's
    `__exit__`). The exception was never raised for real, so no traceback object exists at capture time: what
    capture can answer without one (`tb is None` is False, `if tb:` is true, handing it on to `gen.throw` or back
    to `exc.__traceback__`) stays in the graph; any other use, or one left for the output program to rebuild (an
    `__exit__` that keeps it), is a break at the raise (`TracebackRead`; a `with` block's exit moves any break
    of its `__exit__` there, opcodes/exceptions.py): the raise then runs natively and the traceback is real."""

    def __init__(self, exception: ExceptionValue):
        self.exception = exception

    def python_type(self) -> type:
        return types.TracebackType

    def truth(self, state) -> bool:
        return True

    def getattr(self, state, name: str) -> Value:
        raise self._read(f"attribute {name!r} of")

    def call(self, state, args, kwargs) -> Value:
        raise self._read("a call of")

    def reconstruct(self, writer) -> str:
        raise self._read("rebuilding")

    def _read(self, what: str) -> TracebackRead:
        raised = self.exception.message() or self.exception.cls.__name__
        return TracebackRead(f"{what} the traceback of {raised}, which exists once the raise runs natively",
                             self.exception.raised_at)

    def __repr__(self) -> str:
        return f"Traceback({self.exception.cls.__name__})"


class TracebackRead(GraphBreak):
    """A break on a traced exception's traceback: it belongs at `raised_at`, the root frame's instruction that
    raised the exception (None where the exception has not reached the root frame: the break stays where
    it is, at the call of the frame that raised it)."""

    def __init__(self, detail: str, raised_at):
        super().__init__("exception", detail)
        self.raised_at = raised_at


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
