"""Dicts during capture: `dict`, `OrderedDict`, `defaultdict` and dict subclasses, with Python's semantics.

A `DictValue` keeps its keys (constants, or objects that hash by identity) in insertion order and its
values as trackers. The kind of dict is part of the value and survives everything Python keeps it
through: a `defaultdict` calls its `default_factory` on a missing key and is rebuilt with it, an
`OrderedDict` compares order-sensitively with another `OrderedDict` and moves keys with `move_to_end`.
A dict from the user's world records each mutation as a side effect, replayed after the graph.
"""
from __future__ import annotations

import collections
import operator
from typing import Any

from kiln.capture.breaks import GraphBreak
from kiln.capture.values.base import Value
from kiln.capture.values.classes import function_value
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.containers import TupleValue, _key, _key_value, method_of, python_override
from kiln.capture.values.exceptions import raise_python
from kiln.capture.values.functions import BoundMethodValue, MethodValue
from kiln.capture.values.iterators import iterator_of
from kiln.capture.values.operators import apply_operator, identical


class DictValue(Value):
    """A dict with constant keys; its values are trackers. `default_factory` is a defaultdict's."""

    def __init__(self, items: dict[Any, Value], source=None, cls: type = dict, default_factory: Value | None = None):
        self.items, self.source, self.cls = dict(items), source, cls
        self.default_factory = default_factory

    def python_type(self) -> type:
        return self.cls

    def pairs(self, state) -> list[tuple[Any, Value]]:
        """(key, value) in order: what iterating `d.items()` gives."""
        return list(self.items.items())

    def is_constant(self) -> bool:
        factory = self.default_factory
        return all(v.realize().is_constant() for v in self.items.values()) and (
            factory is None or factory.realize().is_constant())

    def as_constant(self):
        items = {k: v.as_constant() for k, v in self.items.items()}
        if issubclass(self.cls, collections.defaultdict):
            return collections.defaultdict(self._factory_constant(), items)
        return collections.OrderedDict(items) if issubclass(self.cls, collections.OrderedDict) else items

    def _factory_constant(self):
        return None if self.default_factory is None else self.default_factory.as_constant()

    # --- items -------------------------------------------------------------------------------------
    # `d[k]`, `d[k] = v` and `del d[k]` run a dict subclass's own Python `__getitem__`, `__setitem__` or
    # `__delitem__` (inlined; its `super()` calls reach the dict_* methods), else dict's behaviour.
    def getitem(self, state, key: Value) -> Value:
        return self._subscript(state, "__getitem__", [key]) or self.dict_getitem(state, key)

    def setitem(self, state, key: Value, value: Value) -> None:
        if not self._subscript(state, "__setitem__", [key, value]):
            self.dict_setitem(state, key, value)

    def delitem(self, state, key: Value) -> None:
        if not self._subscript(state, "__delitem__", [key]):
            self.dict_delitem(state, key)

    def _subscript(self, state, name: str, args: list[Value]) -> Value | None:
        override = python_override(self.cls, dict, name) if self.cls is not dict else None
        return None if override is None else function_value(state, override).call(state, [self, *args], {})

    def dict_getitem(self, state, key: Value) -> Value:
        k = _key(state, key)
        if k in self.items:
            return self.items[k]
        return self._missing(state, key, k)

    def _missing(self, state, key: Value, k: Any) -> Value:
        """`d[k]` of an absent key: a subclass's `__missing__`, a defaultdict's factory (its result stored), or
        KeyError."""
        override = python_override(self.cls, dict, "__missing__")
        if override is not None:
            return function_value(state, override).call(state, [self, key], {})
        if self.default_factory is not None and not _is_none(self.default_factory):
            value = self.default_factory.call(state, [], {})
            self.setitem(state, key, value)
            return value
        raise raise_python(KeyError, k)

    def dict_setitem(self, state, key: Value, value: Value) -> None:
        k = _key(state, key)
        self.items[k] = value
        if self.source is not None:
            state.side_effects.store_item(self, key, value)

    def dict_delitem(self, state, key: Value) -> None:
        k = _key(state, key)
        if k not in self.items:
            raise raise_python(KeyError, k)
        del self.items[k]
        if self.source is not None:
            state.side_effects.del_item(self, key)

    def unpack(self, state) -> list[Value]:
        return [_key_value(k) for k, _ in self.pairs(state)]

    def length(self, state) -> int:
        return len(self.pairs(state))

    def truth(self, state) -> bool:
        return bool(self.pairs(state))

    # --- methods -----------------------------------------------------------------------------------
    def getattr(self, state, name: str) -> Value:
        if name == "default_factory" and issubclass(self.cls, collections.defaultdict):
            return self.default_factory or ConstantValue(None)
        override = python_override(self.cls, dict, name)
        if override is not None:  # a dict subclass's own Python method runs, inlined

            return MethodValue(self, function_value(state, override))
        if not callable(getattr(self.cls, name, None)):
            if hasattr(self.cls, name):
                raise GraphBreak("unsupported_object", f"attribute {name!r} of a {self.cls.__name__}")
            raise raise_python(AttributeError, f"{self.cls.__name__!r} object has no attribute {name!r}")
        return BoundMethodValue(self, name)

    def call_method(self, state, name: str, args: list[Value], kwargs: dict) -> Value:
        if name in _READS:
            return _READS[name](self, state, *args, **kwargs)
        if name in _MUTATIONS:
            return _MUTATIONS[name](self, state, *args, **kwargs)
        raise GraphBreak("unsupported_call", f"{self.cls.__name__}.{name}")

    def reconstruct(self, writer) -> str:
        if self.source is not None:
            return writer.source_expr(self.source)
        inner = "{" + ", ".join(f"{writer.constant(k)}: {writer.value(v)}" for k, v in self.items.items()) + "}"
        if self.cls is dict:
            return inner
        if issubclass(self.cls, collections.defaultdict):
            factory = "None" if self.default_factory is None else writer.value(self.default_factory)
            return f"{writer.constant(self.cls)}({factory}, {inner})"
        return f"{writer.constant(self.cls)}({inner})"

    def __repr__(self):
        return f"Dict({self.items})"


def _is_none(value: Value) -> bool:
    value = value.realize()
    return value.is_constant() and value.as_constant() is None


def _first_or_last(d: DictValue, state, last: bool) -> Any:
    pairs = d.pairs(state)
    if not pairs:
        raise raise_python(KeyError, "popitem(): dictionary is empty")
    return pairs[-1 if last else 0][0]


# --- reads: (dict, state, *args, **kwargs) -> Value ------------------------------------------------------

def _get(d, state, key, default=None):
    pairs, k = dict(d.pairs(state)), _key(state, key)
    return pairs[k] if k in pairs else default or ConstantValue(None)


def _copy(d, state):
    return DictValue(dict(d.pairs(state)), cls=d.cls, default_factory=d.default_factory)


class DictViewValue(Value):
    """`d.keys()`, `d.values()` or `d.items()`: a live view of one dict tracker.

    Iterating it gives the dict's current items in order; as a constant it is a real view of the
    same items, so keys and items views compare and combine as sets (`a.keys() == b.keys()` ignores
    order, `a.keys() & {...}` is a set) and a values view compares by identity, as in Python.
    """

    def __init__(self, d: DictValue, kind: str):
        self.dict, self.kind = d, kind

    def python_type(self) -> type:
        return type(getattr({}, self.kind)())

    def _items(self, state) -> list[Value]:
        pairs = self.dict.pairs(state)
        if self.kind == "keys":
            return [_key_value(k) for k, _ in pairs]
        if self.kind == "values":
            return [v for _, v in pairs]
        return [TupleValue([_key_value(k), v]) for k, v in pairs]

    def unpack(self, state) -> list[Value]:
        return self._items(state)

    def length(self, state) -> int:
        return len(self.dict.pairs(state))

    def truth(self, state) -> bool:
        return self.length(state) > 0

    def is_constant(self) -> bool:
        return self.kind != "values" and self.dict.is_constant()

    def as_constant(self):
        return getattr(dict(self.dict.as_constant()), self.kind)()

    def getattr(self, state, name: str) -> Value:
        return method_of(self, self.python_type(), name)

    def call_method(self, state, name: str, args: list[Value], kwargs: dict) -> Value:
        if not self.is_constant():
            raise GraphBreak("unsupported_call", f"dict_{self.kind}.{name} over values kiln does not know")
        return ConstantValue(getattr(self.as_constant(), name)(*(a.as_constant() for a in args)))

    def reconstruct(self, writer) -> str:
        return f"{writer.value(self.dict)}.{self.kind}()"

    def __repr__(self):
        return f"DictView({self.kind} of {self.dict})"


_READS = {
    "keys": lambda d, state: DictViewValue(d, "keys"),
    "values": lambda d, state: DictViewValue(d, "values"),
    "items": lambda d, state: DictViewValue(d, "items"),
    "get": _get,
    "__contains__": lambda d, state, key: ConstantValue(_key(state, key) in dict(d.pairs(state))),
    "__getitem__": lambda d, state, key: d.dict_getitem(state, key),
    "__len__": lambda d, state: ConstantValue(d.length(state)),
    "copy": _copy,
    "__or__": lambda d, state, other: merged(state, d, other),
}


# --- mutations -----------------------------------------------------------------------------------------------

def _update(d, state, other=None, **kwargs):
    # OrderedDict.update is MutableMapping's (it stores through `self[k] = v`); dict.update stores directly
    store = d.setitem if issubclass(d.cls, collections.OrderedDict) else d.dict_setitem
    for key, value in (update_pairs(state, other) if other is not None else []) + list(kwargs.items()):
        store(state, _key_value(key), value)
    return ConstantValue(None)


def _pop(d, state, key, *default):
    k = _key(state, key)
    if k not in dict(d.pairs(state)):
        if default:
            return default[0]
        raise raise_python(KeyError, k)
    value = d.items[k]
    d.dict_delitem(state, key)
    return value


def _setdefault(d, state, key, default=None):
    k = _key(state, key)
    if k not in dict(d.pairs(state)):
        d.dict_setitem(state, key, default or ConstantValue(None))
    return d.items[k]


def _clear(d, state):
    for k, _ in d.pairs(state):
        d.dict_delitem(state, _key_value(k))
    return ConstantValue(None)


def _popitem(d, state, last=None):
    if last is not None and not issubclass(d.cls, collections.OrderedDict):
        raise raise_python(TypeError, "dict.popitem() takes no arguments")
    k = _first_or_last(d, state, True if last is None else bool(last.as_constant()))
    value = d.items[k]
    d.dict_delitem(state, _key_value(k))
    return TupleValue([_key_value(k), value])


def _move_to_end(d, state, key, last=None):
    """OrderedDict.move_to_end: reorders in place (the one items dict may be shared: see InstanceDictValue)."""
    if not issubclass(d.cls, collections.OrderedDict):
        raise raise_python(AttributeError, f"{d.cls.__name__!r} object has no attribute 'move_to_end'")
    k, at_end = _key(state, key), True if last is None else bool(last.as_constant())
    pairs = dict(d.pairs(state))
    if k not in pairs:
        raise raise_python(KeyError, k)
    value = pairs.pop(k)
    reordered = {**pairs, k: value} if at_end else {k: value, **pairs}
    d.items.clear()
    d.items.update(reordered)
    if d.source is not None:
        state.side_effects.deferred_call(BoundMethodValue(d, "move_to_end"), [key, ConstantValue(at_end)], {})
    return ConstantValue(None)


def _ior(d, state, other):
    _update(d, state, other)
    return d


_MUTATIONS = {
    "update": _update,
    "__setitem__": lambda d, state, key, value: (d.dict_setitem(state, key, value), ConstantValue(None))[1],
    "__delitem__": lambda d, state, key: (d.dict_delitem(state, key), ConstantValue(None))[1],
    "pop": _pop,
    "setdefault": _setdefault,
    "clear": _clear,
    "popitem": _popitem,
    "move_to_end": _move_to_end,
    "__ior__": _ior,
}


# --- operations on several dicts --------------------------------------------------------------------------

def update_pairs(state, other: Value) -> list[tuple[Any, Value]]:
    """What `d.update(other)` / `dict(other)` adds: a dict's pairs, or an iterable of (key, value) pairs."""
    other = other.realize()
    if isinstance(other, DictValue):
        return other.pairs(state)
    if hasattr(other.python_type(), "keys"):  # a mapping (ChainMap, a user Mapping): other[k] for k in keys()
        keys = iterator_of(state, other.getattr(state, "keys").call(state, [], {})).unpack(state)
        return [(_key(state, k), other.getitem(state, k)) for k in keys]
    pairs = []
    for pair in other.unpack(state):
        items = pair.unpack(state)
        if len(items) != 2:
            raise raise_python(ValueError, f"dictionary update sequence element has length {len(items)}; 2 is required")
        pairs.append((_key(state, items[0]), items[1]))
    return pairs


def merged(state, left: DictValue, right: Value) -> Value:
    """`left | right`: a new dict of left's kind (an OrderedDict stays one, a defaultdict keeps its factory)."""
    if not isinstance(right.realize(), DictValue):
        raise raise_python(TypeError, f"unsupported operand type(s) for |: {left.cls.__name__!r} and another type")
    result = _copy(left, state)
    _update(result, state, right)
    return result


def equal(state, a: DictValue, b: DictValue) -> bool:
    """`a == b` for dicts: same keys (in the same order when both are OrderedDicts) and values that are
    the same object or compare equal, as CPython compares them."""
    pa, pb = dict(a.pairs(state)), dict(b.pairs(state))
    ordered = issubclass(a.cls, collections.OrderedDict) and issubclass(b.cls, collections.OrderedDict)
    if (list(pa) != list(pb)) if ordered else (pa.keys() != pb.keys()):
        return False
    return all(identical(state, pa[k], pb[k]) or apply_operator(state, operator.eq, [pa[k], pb[k]]).truth(state)
               for k in pa)


def fromkeys(state, cls: type, keys: Value, value: Value | None = None) -> DictValue:
    """`dict.fromkeys(keys, value)` (and OrderedDict's, defaultdict's): every key maps to the one value."""
    value = value or ConstantValue(None)
    return DictValue({_key(state, k): value for k in keys.unpack(state)}, cls=cls)
