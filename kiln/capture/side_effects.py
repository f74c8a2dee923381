"""Side effects on the user's Python objects, recorded during capture, replayed after the graph.

Attribute stores, global stores and container mutations made by traced code
must happen exactly as in eager. During capture they go into this log (and an
overlay, so later reads in the same frame see them); the output program
replays them in program order after the graph has run.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.capture.output import ProgramWriter
    from kiln.capture.values.base import Value


@dataclass
class Effect:
    """One mutation: `kind` is 'setattr', 'delattr', 'setitem', 'delitem', 'replace' or 'call'."""

    kind: str
    target: Value
    key: Any
    value: Value | None

    def render(self, writer: ProgramWriter) -> str:
        target = writer.before_effects(self.target)
        if self.kind == "setattr" and self.key.isidentifier():
            return f"{target}.{self.key} = {writer.before_effects(self.value)}"
        if self.kind == "setattr":
            return f"setattr({target}, {self.key!r}, {writer.before_effects(self.value)})"
        if self.kind == "delattr":
            return f"delattr({target}, {self.key!r})"
        base = _raw_store_base(self.target.python_type()) if self.kind in ("setitem", "delitem") else None
        if self.kind == "setitem" and base is not None:
            value = writer.before_effects(self.value)
            return f"{writer.constant(base)}.__setitem__({target}, {writer.before_effects(self.key)}, {value})"
        if self.kind == "setitem":
            return f"{target}[{writer.before_effects(self.key)}] = {writer.before_effects(self.value)}"
        if self.kind == "delitem" and base is not None:
            return f"{writer.constant(base)}.__delitem__({target}, {writer.before_effects(self.key)})"
        if self.kind == "delitem":
            return f"del {target}[{writer.before_effects(self.key)}]"
        if self.kind == "replace":  # a list or dict mutated in place: write its final contents back
            return self.target.render_replace(writer, target)
        if self.kind == "call":  # a call with only external effects (a log line), made after the graph
            args = [writer.before_effects(a) for a in self.key] + [
                f"{k}={writer.before_effects(v)}" for k, v in self.value.items()]
            return f"{target}({', '.join(args)})"
        raise AssertionError(self.kind)


def _raw_store_base(cls: type) -> type | None:
    """For a dict subclass with its own `__setitem__`/`__delitem__`, the builtin class (dict, OrderedDict)
    whose stores capture recorded: the override already ran during capture, so the replay repeats the
    builtin stores it made, not the override. None for other targets."""
    if not issubclass(cls, dict):
        return None
    builtin = next(klass for klass in cls.__mro__ if not klass.__flags__ & _HEAP_TYPE)
    overrides = any(isinstance(klass.__dict__.get(name), types.FunctionType)
                    for klass in cls.__mro__[:cls.__mro__.index(builtin)] for name in ("__setitem__", "__delitem__"))
    return builtin if overrides else None


_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python


@dataclass
class SideEffects:
    effects: list[Effect] = field(default_factory=list)
    _attrs: dict[tuple[int, str], Value] = field(default_factory=dict)  # (id(obj), name) -> value
    _replaced: set[int] = field(default_factory=set)

    def store_attr(self, obj: Any, target: Value, name: str, value: Value) -> None:
        self._attrs[(id(obj), name)] = value
        self.effects.append(Effect("setattr", target, name, value))

    def del_attr(self, obj: Any, target: Value, name: str) -> None:
        self._attrs[(id(obj), name)] = _DELETED
        self.effects.append(Effect("delattr", target, name, None))

    def shadow_attr(self, obj: Any, name: str, value: Value | None) -> None:
        """`obj.__dict__[name]` was written (None: deleted) by an effect recorded as a dict store:
        later attribute reads in this capture see it, and no second effect is recorded."""
        self._attrs[(id(obj), name)] = _DELETED if value is None else value

    def instance_attrs(self, obj: Any) -> list[tuple[str, Any]]:
        """(name, value or the deleted marker) of every attribute of `obj` stored in this capture, in order."""
        key = id(obj)
        return [(name, value) for (owner, name), value in self._attrs.items() if owner == key]

    def pending_attr(self, obj: Any, name: str) -> Value | None:
        """The value traced code stored in `obj.name` earlier in this capture, if any."""
        return self._attrs.get((id(obj), name))

    def store_item(self, target: Value, key: Value, value: Value) -> None:
        self.effects.append(Effect("setitem", target, key, value))

    def del_item(self, target: Value, key: Value) -> None:
        self.effects.append(Effect("delitem", target, key, None))

    def deferred_call(self, fn: Value, args: list[Value], kwargs: dict[str, Value]) -> None:
        """`fn(*args, **kwargs)` runs after the graph, in order with the other effects (logging, warnings)."""
        self.effects.append(Effect("call", fn, list(args), dict(kwargs)))

    def replace_contents(self, target: Value) -> None:
        """A pre-existing list/dict was mutated: write its final contents back (once)."""
        if id(target) not in self._replaced:
            self._replaced.add(id(target))
            self.effects.append(Effect("replace", target, None, None))

    def __len__(self) -> int:
        return len(self.effects)


class _Deleted:
    def __repr__(self) -> str:
        return "<deleted>"


_DELETED = _Deleted()


def is_deleted(value: Any) -> bool:
    return value is _DELETED
