"""`os.environ` during capture: each variable the traced code reads is specialized on and guarded.

Library code asks the environment for switches (`os.environ.get("X", "0") == "1"`).
Inlining `Mapping.get` would trace the KeyError its `try` relies on; instead a read
answers with the variable's value now, and a guard on that one variable (present or
absent, and its value) recompiles the frame if it changes. Writes are graph breaks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from kiln.capture.breaks import GraphBreak
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.sources import Source
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.functions import BoundMethodValue

ENVIRON_NAME = "___os_environ"


@dataclass(frozen=True)
class EnvironSource(Source):
    """One environment variable, or None when unset."""

    key: str

    def expr(self) -> str:
        return f"{ENVIRON_NAME}.get({self.key!r})"

    def name(self) -> str:
        return f"environ_{self.key}"


class EnvironValue(Value):
    def __init__(self, source: Source):
        self.source, self.obj = source, os.environ

    def python_type(self) -> type:
        return type(os.environ)

    def read(self, state, key: Value) -> str | None:
        """The variable's value now, guarded."""
        name = key.as_constant()
        if not isinstance(name, str):
            raise GraphBreak("unsupported_object", f"os.environ[{name!r}]")
        state.guards.namespace[ENVIRON_NAME] = os.environ
        value = os.environ.get(name)
        source = EnvironSource(name)
        state.guards.add(Guard(GuardKind.EQUALS_MATCH, source, f"{source.expr()} == {value!r}", repr(value),
                               source.expr()))
        return value

    def getattr(self, state, name: str) -> Value:
        if name in ("get", "__contains__", "__getitem__"):
            return BoundMethodValue(self, name)
        raise GraphBreak("unsupported_object", f"os.environ.{name}")

    def call_method(self, state, name: str, args: list[Value], kwargs: dict[str, Value]) -> Value:
        value = self.read(state, args[0])
        if name == "__contains__":
            return ConstantValue(value is not None)
        if name == "__getitem__":
            return self.getitem(state, args[0])
        default = args[1] if len(args) > 1 else kwargs.get("default", ConstantValue(None))
        return ConstantValue(value) if value is not None else default

    def getitem(self, state, key: Value) -> Value:
        value = self.read(state, key)
        if value is None:
            raise GraphBreak("exception", f"KeyError: {key.as_constant()!r}")
        return ConstantValue(value)

    def setitem(self, state, key: Value, value: Value) -> None:
        raise GraphBreak("unsupported_object", "setting an environment variable inside the compiled region")

    def __repr__(self) -> str:
        return "Environ()"
