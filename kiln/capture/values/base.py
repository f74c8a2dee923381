"""The base of the value trackers: what the interpreter keeps on its stack and in locals.

A `Value` stands for one Python value of the user's program during capture.
Each kind (tensor, constant, list, function, module, ...) implements the
operations Python performs on it (attribute, call, item, iteration, truth) in
terms of the capture `state` (graph, guards, side effects). What a kind cannot
model raises `GraphBreak`. A value with a `source` already exists in the
user's world and can be fetched again by the output program; a value without
one was made during capture and is rebuilt by `reconstruct`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.capture.breaks import GraphBreak
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.sources import Source

if TYPE_CHECKING:
    from kiln.capture.output import ProgramWriter
    from kiln.capture.state import CaptureState


class Value:
    source: Source | None = None

    # --- what Python does with a value -------------------------------------------------
    def python_type(self) -> type:
        raise GraphBreak("unsupported_object", f"the type of {self} is not known at capture time")

    def as_constant(self) -> Any:
        """The Python value, when capture knows it exactly (installs the guards that makes it so)."""
        raise GraphBreak("unsupported_object", f"{self} is not a constant")

    def is_constant(self) -> bool:
        return False

    def getattr(self, state: CaptureState, name: str) -> Value:
        raise GraphBreak("unsupported_object", f"attribute {name!r} of {self}")

    def setattr(self, state: CaptureState, name: str, value: Value) -> None:
        raise GraphBreak("unsupported_object", f"setting attribute {name!r} of {self}")

    def delattr(self, state: CaptureState, name: str) -> None:
        raise GraphBreak("unsupported_object", f"deleting attribute {name!r} of {self}")

    def call(self, state: CaptureState, args: list[Value], kwargs: dict[str, Value]) -> Value:
        raise GraphBreak("unsupported_call", f"calling {self}")

    def getitem(self, state: CaptureState, key: Value) -> Value:
        raise GraphBreak("unsupported_object", f"indexing {self}")

    def setitem(self, state: CaptureState, key: Value, value: Value) -> None:
        raise GraphBreak("unsupported_object", f"item assignment on {self}")

    def delitem(self, state: CaptureState, key: Value) -> None:
        raise GraphBreak("unsupported_object", f"item deletion on {self}")

    def unpack(self, state: CaptureState) -> list[Value]:
        """The items of a finite iterable (for loops, unpacking, list(x), *args)."""
        raise GraphBreak("unsupported_object", f"iterating over {self}")

    def length(self, state: CaptureState) -> int:
        return len(self.unpack(state))

    def truth(self, state: CaptureState) -> bool:
        return bool(self.as_constant())

    # --- the output program ---------------------------------------------------------------
    def reconstruct(self, writer: ProgramWriter) -> str:
        """A Python expression that rebuilds this value after the graph ran."""
        if self.source is not None:
            return writer.source_expr(self.source)
        raise GraphBreak("unsupported_object", f"{self} cannot be rebuilt outside the graph")

    def realize(self) -> Value:
        """The tracker itself; a lazy input returns what it realized to."""
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.source or ''})"


class NullValue(Value):
    """CPython's NULL on the value stack (below a callable, or below a method's self)."""

    def reconstruct(self, writer: ProgramWriter) -> str:
        raise AssertionError("NULL is never rebuilt; continuations re-create it")

    def __repr__(self) -> str:
        return "NULL"


NULL = NullValue()


class UnguardedValue(Value):
    """An input of a frame stepped through natively (a continuation past its cache limit): its entry has
    no guards, so nothing about the value may be folded, not even its type or identity. Every use breaks
    (the base class's answers), and the output program does it with the real object."""

    def __init__(self, source: Source):
        self.source = source

    def __repr__(self) -> str:
        return f"Unguarded({self.source})"


class LazyValue(Value):
    """An input not looked at yet: it installs guards only when the code uses it.

    Continuations receive every live local; most are only passed along, so
    they cost no guard and no graph input until an operation needs them.
    """

    def __init__(self, state: CaptureState, obj: Any, source: Source):
        self._state, self._obj, self.source = state, obj, source
        self._realized: Value | None = None

    def realize(self) -> Value:
        if self._realized is None:
            self._realized = self._state.wrap(self._obj, self.source)
        return self._realized

    def is_one_of(self, objects: tuple) -> bool:
        """Whether this input is one of `objects`, told by identity and guarded either way, without wrapping it:
        wrapping an object kiln does not model (a bound method of a lazily negated tensor) breaks the graph,
        which where the question is asked (writing the program of a break already chosen) it cannot."""
        expr = self._state.source_expr(self.source)
        names = [self._state.guards.constant(o, "obj") for o in objects]
        found = next((k for k, o in enumerate(objects) if self._obj is o), None)
        readable = [getattr(o, "__name__", repr(o)) for o in objects]
        if found is not None:
            check, expected = f"{expr} is {names[found]}", readable[found]
        else:
            check, expected = f"not ({' or '.join(f'{expr} is {n}' for n in names)})", f"none of {', '.join(readable)}"
        self._state.guards.add(Guard(GuardKind.ID_MATCH, self.source, check, expected, self.source.expr()))
        return found is not None

    def __getattr__(self, name: str):  # noqa: D401 - delegation
        raise AttributeError(name)

    def python_type(self):
        return self.realize().python_type()

    def as_constant(self):
        return self.realize().as_constant()

    def is_constant(self):
        return self.realize().is_constant()

    def getattr(self, state, name):
        return self.realize().getattr(state, name)

    def setattr(self, state, name, value):
        return self.realize().setattr(state, name, value)

    def delattr(self, state, name):
        return self.realize().delattr(state, name)

    def call(self, state, args, kwargs):
        return self.realize().call(state, args, kwargs)

    def getitem(self, state, key):
        return self.realize().getitem(state, key)

    def setitem(self, state, key, value):
        return self.realize().setitem(state, key, value)

    def delitem(self, state, key):
        return self.realize().delitem(state, key)

    def unpack(self, state):
        return self.realize().unpack(state)

    def length(self, state):
        return self.realize().length(state)

    def truth(self, state):
        return self.realize().truth(state)

    def reconstruct(self, writer):
        if self._realized is not None:
            return self._realized.reconstruct(writer)
        return writer.source_expr(self.source)

    def __repr__(self):
        return f"Lazy({self.source})"


def realize(v: Value) -> Value:
    return v.realize()
