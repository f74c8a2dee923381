"""Python containers during capture: tuples, lists, dicts, sets, slices and iterators.

Containers built by the traced code are fully symbolic (their items are
trackers). Containers that already existed (an argument, `self.cache`) are
wrapped with a length or keys guard, their items wrapped lazily by source;
mutating one is a side effect replayed after the graph.
"""
from __future__ import annotations

import operator
import types
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.breaks import GraphBreak
from kiln.capture.values.base import Value
from kiln.capture.values.classes import class_attribute
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.exceptions import python_error, raise_python
from kiln.capture.values.functions import BoundMethodValue
from kiln.capture.values.symbolic import SymValue


def replayed(container: Value, operation: Callable[[list], Any]) -> Any:
    """`operation` on the items of a list or tuple tracker (their Python list), as the user's container runs it.

    Where Python raises (an index out of range, an index of the wrong type, `pop` from an empty list), the
    exception is the user's, as eager raises it at that point, and traced code may catch it: a failure of
    capture it is not. A tuple's messages name the tuple ("tuple index out of range"): the operation runs
    again on a real tuple of the items to raise them."""
    try:
        return operation(container.items)
    except Exception as e:
        if container.python_type() is tuple:
            try:
                operation(tuple(container.items))
            except Exception as eager:
                raise python_error(eager, type(container).__name__) from e
        raise python_error(e, type(container).__name__) from e


def _key(state, key: Value) -> Any:
    k = key.realize()
    if k.is_constant() or isinstance(k, SymValue):  # a dynamic size as a key is specialized (guarded), as torch does
        value = k.as_constant()
        try:
            hash(value)
        except TypeError as e:  # `d[[]]`: eager's "unhashable type", the user's to catch
            raise python_error(e, "hash") from e
        return value
    obj = getattr(k, "obj", None)  # modules, functions and classes hash by identity
    if obj is not None:
        return obj
    raise GraphBreak("unsupported_object", f"{k} as a dict key")


def sort_keys(state, items: list[Value], key: Value | None) -> list[Any]:
    """The Python values `sorted`, `min` and `max` compare: each item's, or what `key(item)` returns for it
    (the key function traced once per item, in order, as Python calls it)."""
    from kiln.capture.values.tensor import TensorValue

    if key is not None and not (key.is_constant() and key.as_constant() is None):
        items = [key.call(state, [item], {}) for item in items]
    keys = []
    for item in items:
        if isinstance(item.realize(), TensorValue):
            raise GraphBreak("data_dependent_branch", "sorting or comparing tensors in Python")
        keys.append(item.as_constant())
    return keys


def sort_order(state, items: list[Value], key: Value | None, reverse: Value | None) -> list[int]:
    """The positions of `items` in sorted order: stable, `reverse` keeping equal items in order, as list.sort."""
    keys = sort_keys(state, items, key)
    descending = bool(reverse is not None and reverse.as_constant())
    try:
        return sorted(range(len(keys)), key=keys.__getitem__, reverse=descending)
    except TypeError as e:  # '<' not supported between two items: Python raises it from the sort
        raise raise_python(TypeError, str(e)) from None


class SequenceValue(Value):
    items: list[Value]

    def unpack(self, state) -> list[Value]:
        return list(self.items)

    def length(self, state) -> int:
        return len(self.items)

    def truth(self, state) -> bool:
        return len(self.items) > 0

    def is_constant(self) -> bool:
        return all(i.realize().is_constant() for i in self.items)

    def as_constant(self):
        return self.python_type()(i.as_constant() for i in self.items)

    def getitem(self, state, key: Value) -> Value:
        k = key.realize()
        from kiln.capture.values.tensor import TensorValue

        if isinstance(k, TensorValue):
            raise GraphBreak("tensor_to_python", "indexing a Python sequence with a tensor")
        index = k.as_constant()
        if isinstance(index, slice):
            return self.rebuild(self.items[index])
        return replayed(self, lambda items: items[index])

    def rebuild(self, items: list[Value]) -> Value:
        return type(self)(items)

    def call_method(self, state, name: str, args: list[Value], kwargs: dict) -> Value:
        if name == "index":
            target = args[0].as_constant()
            return ConstantValue([i.as_constant() for i in self.items].index(target))
        if name == "count":
            target = args[0].as_constant()
            return ConstantValue(sum(1 for i in self.items if i.is_constant() and i.as_constant() == target))
        raise GraphBreak("unsupported_call", f"{self.python_type().__name__}.{name}")

    def _items_expr(self, writer) -> str:
        return ", ".join(writer.value(i) for i in self.items)  # value(): one object per tracker (`[a, a]`)


class TupleValue(SequenceValue):
    def __init__(self, items: list[Value], cls: type = tuple, source=None):
        self.items, self.cls, self.source = list(items), cls, source

    def python_type(self) -> type:
        return self.cls

    def as_constant(self):
        values = [i.as_constant() for i in self.items]
        if self.cls is tuple:
            return tuple(values)
        return self.cls(values) if _is_structseq(self.cls) else self.cls(*values)

    def rebuild(self, items):
        return TupleValue(items)

    def getattr(self, state, name: str) -> Value:
        fields = getattr(self.cls, "_fields", None) or getattr(self.cls, "__match_args__", ())
        if name in fields:
            return self.items[list(fields).index(name)]
        if name in ("index", "count", "_asdict", "_replace"):
            return BoundMethodValue(self, name)
        if _defined_above_tuple(self.cls, name):  # a NamedTuple's own method, property or class constant
            return class_attribute(state, self, self.cls, name, None)
        return method_of(self, self.cls, name)

    def call_method(self, state, name, args, kwargs):
        if name == "_asdict":
            from kiln.capture.values.dicts import DictValue

            fields = self.cls._fields
            return DictValue(dict(zip(fields, self.items)))
        if name == "_replace":
            fields = list(self.cls._fields)
            items = list(self.items)
            for k, v in kwargs.items():
                items[fields.index(k)] = v
            return TupleValue(items, self.cls)
        return super().call_method(state, name, args, kwargs)

    def reconstruct(self, writer) -> str:
        if self.source is not None:
            return writer.source_expr(self.source)
        inner = self._items_expr(writer)
        if self.cls is tuple:
            return f"({inner},)" if len(self.items) == 1 else f"({inner})"
        cls = writer.constant(self.cls)
        return f"{cls}([{inner}])" if _is_structseq(self.cls) else f"{cls}({inner})"

    def __repr__(self):
        return f"Tuple({self.items})"


class SizeValue(TupleValue):
    """`t.shape` of a tensor with dynamic dimensions: a torch.Size whose entries may be symbolic."""

    def __init__(self, items: list[Value]):
        super().__init__(items, cls=torch.Size)

    def as_constant(self):
        return torch.Size([i.as_constant() for i in self.items])

    def rebuild(self, items):
        return SizeValue(items)

    def getattr(self, state, name: str) -> Value:
        if name == "numel":
            return BoundMethodValue(self, name)
        return super().getattr(state, name)

    def call_method(self, state, name, args, kwargs):
        if name == "numel":
            from kiln.capture.values.operators import apply_operator

            total = ConstantValue(1)
            for item in self.items:
                total = apply_operator(state, operator.mul, [total, item])
            return total
        return super().call_method(state, name, args, kwargs)

    def reconstruct(self, writer) -> str:
        return f"{writer.constant(torch.Size)}([{self._items_expr(writer)}])"


def _is_structseq(cls: type) -> bool:
    return cls.__module__ == "torch.return_types"


class ListValue(SequenceValue):
    def __init__(self, items: list[Value], source=None):
        self.items, self.source = list(items), source

    def python_type(self) -> type:
        return list

    def as_constant(self):
        return [i.as_constant() for i in self.items]

    def mutated(self, state) -> None:
        """Record that this list changed: one from the user's world gets its final contents written back."""
        if self.source is not None:
            state.side_effects.replace_contents(self)

    def setitem(self, state, key: Value, value: Value) -> None:
        index = key.as_constant()
        value = value.unpack(state) if isinstance(index, slice) else value
        replayed(self, lambda items: items.__setitem__(index, value))
        self.mutated(state)

    def delitem(self, state, key: Value) -> None:
        index = key.as_constant()
        replayed(self, lambda items: items.__delitem__(index))
        self.mutated(state)

    def getattr(self, state, name: str) -> Value:
        return method_of(self, list, name)

    def call_method(self, state, name: str, args: list[Value], kwargs: dict) -> Value:
        if name == "append":
            self.items.append(args[0])
        elif name == "extend":
            self.items.extend(args[0].unpack(state))
        elif name == "insert":
            self.items.insert(args[0].as_constant(), args[1])
        elif name == "pop":
            value = replayed(self, lambda items: items.pop(*(a.as_constant() for a in args)))
            self.mutated(state)
            return value
        elif name == "clear":
            self.items.clear()
        elif name == "reverse":
            self.items.reverse()
        elif name == "copy":
            return ListValue(list(self.items))
        elif name == "sort":
            order = sort_order(state, self.items, kwargs.get("key"), kwargs.get("reverse"))
            self.items[:] = [self.items[i] for i in order]
        elif name == "remove":
            target = args[0].as_constant()
            del self.items[[i.as_constant() for i in self.items].index(target)]
        else:
            return super().call_method(state, name, args, kwargs)
        self.mutated(state)
        return ConstantValue(None)

    def render_replace(self, writer, target: str) -> str:
        return f"{target}[:] = [{self._items_expr(writer)}]"

    def reconstruct(self, writer) -> str:
        if self.source is not None:
            return writer.source_expr(self.source)
        if _holds(self, self):  # a list that contains itself (the links of functools' Python lru_cache):
            # made empty first, so its items can refer to it, and filled once every value is rebuilt
            made = writer.declare(self, "[]")
            writer.after_values(lambda: f"{made}[:] = [{self._items_expr(writer)}]")
            return made
        return f"[{self._items_expr(writer)}]"

    def __repr__(self):
        return f"List({self.items})"


def _holds(container: Value, target: Value) -> bool:
    """Whether `target` is reachable through the items of lists and tuples made during capture, from
    `container`'s items."""
    seen, pending = set(), list(container.items)
    while pending:
        item = pending.pop()
        if item is target:
            return True
        if id(item) not in seen and isinstance(item, SequenceValue) and item.source is None:
            seen.add(id(item))
            pending.extend(item.items)
    return False


def _defined_above_tuple(cls: type, name: str) -> bool:
    """Whether a tuple subclass (a namedtuple, a typing.NamedTuple) defines `name` itself, not tuple."""
    for klass in cls.__mro__:
        if klass is tuple:
            return False
        if name in klass.__dict__:
            return True
    return False


def method_of(value: Value, cls: type, name: str) -> Value:
    """`value.name` of a container: its method (which the tracker's `call_method` runs), or the
    AttributeError Python raises (`hasattr([], "shape")` is False, `getattr(xs, "n", 0)` is 0)."""
    if callable(getattr(cls, name, None)):
        return BoundMethodValue(value, name)
    if hasattr(cls, name):
        raise GraphBreak("unsupported_object", f"attribute {name!r} of a {cls.__name__}")
    raise raise_python(AttributeError, f"{cls.__name__!r} object has no attribute {name!r}")


def from_constant(value: Any) -> Value:
    """A folded result as a tracker: a list, dict or set (a new, mutable object on every call) as a
    container tracker the output program rebuilds, never one object kept in the program's namespace."""
    if type(value) is list:
        return ListValue([from_constant(v) for v in value])
    if type(value) is set:
        return SetValue.of_keys(value, {})  # the real set itself: its iteration order is Python's
    if type(value) is dict:
        from kiln.capture.values.dicts import DictValue

        return DictValue({k: from_constant(v) for k, v in value.items()})
    return ConstantValue(value)


def python_override(cls: type, base: type, name: str):
    """The Python function `cls` (a subclass of the builtin `base`) defines for `name`, if any."""
    for klass in cls.__mro__:
        if klass is base:
            return None
        attr = klass.__dict__.get(name)
        if isinstance(attr, types.FunctionType):
            return attr
    return None


def _set_key(value: Value) -> Any:
    """What a set hashes an item by: tensors by identity (the input tensor, or the graph value).

    Only sets take tensors: a dict keyed by a tensor would be rebuilt with a stale key.
    """
    from kiln.capture.values.tensor import TensorValue

    v = value.realize()
    if isinstance(v, TensorValue):
        return _TensorKey(v.real if v.real is not None else v.node)
    return _key(None, v)


class _TensorKey:
    """A tensor item's key in a set's shadow: equal by identity and hashed as Python hashes the tensor
    (`id`), so a set of input tensors iterates in eager's order (a tensor made by the graph has no
    object yet: its graph node stands in)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __hash__(self) -> int:
        return hash(self.obj)

    def __eq__(self, other) -> bool:
        return isinstance(other, _TensorKey) and other.obj is self.obj


def _key_value(k: Any) -> Value:
    from kiln.capture.values.objects import object_value

    return ConstantValue(k) if isinstance(k, (int, float, str, bool, type(None), tuple, bytes)) else object_value(k)


class SetValue(Value):
    """A set of constants or of objects hashed by identity (modules: `memo` sets in nn.Module's generators).

    Every operation runs on a real shadow set of the items' keys (`_set_key`), in the order the traced code
    runs it, so membership, mutation (`discard`, `pop`, `-=`...) and iteration order are Python's own;
    `_items` maps each non-constant key back to its tracker.
    """

    def __init__(self, items: list[Value]):
        self.keys: set = set()
        self._items: dict = {}
        # The set's making, as (method, constant arguments) from an empty set, while every step is one the
        # output program can repeat: a set's iteration order depends on its history (a merge presizes the
        # table, adding one at a time grows it), so a set rebuilt from its items may iterate otherwise than
        # eager's. None once a step cannot be repeated; the set is then rebuilt from its items.
        self.recipe: list | None = []
        for item in items:
            self._add(item)

    @classmethod
    def of_keys(cls, keys: set, pool: dict) -> SetValue:
        """A set holding `keys` (a real set, so its order is Python's), trackers looked up in `pool`."""
        value = cls([])
        value.keys = keys
        value._items = {k: pool[k] for k in keys if k in pool}
        value.recipe = None  # made by a C operation on other sets (union, copy...)
        return value

    def _add(self, item: Value) -> None:
        key = _set_key(item)
        try:
            new = key not in self.keys  # an object's own __hash__ / __eq__ may raise: the user's exception
        except Exception as e:
            raise python_error(e, "set.add") from e
        if new:
            self.keys.add(key)
            if not item.realize().is_constant():
                self._items[key] = item
        self._record("add", (key,))

    def _record(self, name: str, args: tuple) -> None:
        if self.recipe is None:
            return
        if self._items or not all(type(a) in _REPEATABLE_ARGUMENTS for a in args):
            self.recipe = None
        else:
            self.recipe.append((name, args))

    def update_from(self, state, iterable: Value) -> None:
        """`s.update(iterable)` (`set(iterable)`, `{*a, *b}`) as CPython runs it: a set, frozenset or dict merged
        at once (its table presized), anything else item by item."""
        it = iterable.realize()
        from kiln.capture.values.dicts import DictValue

        if isinstance(it, (SetValue, DictValue)) or (it.is_constant() and type(it.as_constant()) in _MERGED):
            self.call_method(state, "update", [it], {})
        else:
            for item in it.unpack(state):
                self._add(item)

    def _item(self, key: Any) -> Value:
        return self._items[key] if key in self._items else ConstantValue(key)

    def python_type(self):
        return set

    def is_constant(self):
        return not self._items

    def as_constant(self):
        return set(self.keys)

    def unpack(self, state):
        return [self._item(k) for k in self.keys]

    def length(self, state) -> int:
        return len(self.keys)

    def truth(self, state) -> bool:
        return bool(self.keys)

    def getattr(self, state, name):
        return method_of(self, set, name)

    def call_method(self, state, name, args, kwargs):
        """Any set method: run on the shadow keys; a set result (union, copy...) becomes a new tracker."""
        if kwargs:
            raise GraphBreak("unsupported_call", f"set.{name} with keyword arguments")
        pool = dict(self._items)
        try:  # a missing key, an unhashable item, an object's own __hash__ or __eq__ raising: the user's
            real_args = [_set_item(a, pool) if name in _ELEMENT_METHODS else _set_argument(state, a, pool)
                         for a in args]
            result = getattr(self.keys, name)(*real_args)
        except GraphBreak:
            raise
        except Exception as e:
            raise python_error(e, f"set.{name}") from e
        self._items = {k: v for k, v in pool.items() if k in self.keys}
        if name not in _READING_METHODS:
            self._record(name, tuple(real_args))
        if result is NotImplemented:  # `s | [1]`: set operators take sets only
            raise raise_python(TypeError, f"unsupported operand type(s) for set.{name}")
        if result is self.keys:  # `s |= t` returns s itself
            return self
        if isinstance(result, set):
            return SetValue.of_keys(result, pool)
        if name == "pop":
            return pool[result] if result in pool else ConstantValue(result)
        return ConstantValue(result)

    def reconstruct(self, writer):
        if self.recipe and not self._items:
            return f"{writer.constant(_made_by)}({writer.constant(tuple(self.recipe))})"
        items = self.unpack(None)
        return "{" + ", ".join(writer.value(i) for i in items) + "}" if items else "set()"


def _made_by(recipe: tuple) -> set:
    """A new set made as the traced code made its set (`SetValue.recipe`), so it iterates as eager's does."""
    made = set()
    for name, args in recipe:
        getattr(made, name)(*args)
    return made


_ELEMENT_METHODS = frozenset({"add", "discard", "remove", "__contains__"})  # the others take iterables
# set methods that leave the set as it is (the others change it, and are a step of its recipe)
_READING_METHODS = frozenset({"__contains__", "copy", "difference", "intersection", "isdisjoint", "issubset",
                              "issuperset", "symmetric_difference", "union", "__len__", "__or__", "__and__",
                              "__sub__", "__xor__", "__eq__", "__ne__", "__le__", "__lt__", "__ge__", "__gt__",
                              "__ror__", "__rand__", "__rsub__", "__rxor__", "__iter__"})
# arguments a recipe may hold: immutable, or (a dict, a list) made for the step and held by nothing else
_REPEATABLE_ARGUMENTS = (int, float, bool, str, bytes, complex, type(None), tuple, frozenset, list, dict)
_MERGED = (set, frozenset, dict)  # what set.update merges at once rather than item by item


def _set_item(item: Value, pool: dict) -> Any:
    """One element's key; a non-constant element's tracker goes into `pool`."""
    key = _set_key(item)
    if not item.realize().is_constant():
        pool[key] = item
    return key


def _set_argument(state, arg: Value, pool: dict) -> Any:
    """An iterable argument (`s.update(xs)`, `s - t`) as real keys: a set's shadow, another container's keys.

    The trackers behind non-constant keys go into `pool`, so a result can map its keys back to them.
    """
    from kiln.capture.values.dicts import DictValue, DictViewValue

    arg = arg.realize()
    if isinstance(arg, SetValue):
        pool.update(arg._items)
        return arg.keys
    if isinstance(arg, DictValue):  # a dict, as the merge of a dict presizes the set's table
        return dict.fromkeys(_set_item(i, pool) for i in arg.unpack(state))
    if isinstance(arg, (SequenceValue, IteratorValue, DictViewValue)):
        return [_set_item(i, pool) for i in arg.unpack(state)]
    if arg.is_constant():
        return arg.as_constant()
    raise GraphBreak("unsupported_call", f"a set method on {arg}")


class SliceValue(Value):
    def __init__(self, start: Value, stop: Value, step: Value):
        self.start, self.stop, self.step = start, stop, step

    def python_type(self):
        return slice

    def is_constant(self):
        return all(p.realize().is_constant() for p in (self.start, self.stop, self.step))

    def as_constant(self):
        return slice(self.start.as_constant(), self.stop.as_constant(), self.step.as_constant())

    def reconstruct(self, writer):
        parts = (self.start.reconstruct(writer), self.stop.reconstruct(writer), self.step.reconstruct(writer))
        return f"slice({', '.join(parts)})"


class IteratorValue(Value):
    """An iterator over known items (a list, range, zip, enumerate, dict keys...).

    `kind` is the type eager's iterator has (`tuple_iterator`, `itertools.combinations`, ...), and `fresh`
    writes a new such iterator over the same items (`iter(t)` of the rebuilt tuple); at a graph break it is
    rebuilt as that, advanced to the position reached, so `type(it)` and `sys.getsizeof(it)` stay eager's.
    Without them the iterator is a list iterator over the remaining items."""

    def __init__(self, items: list[Value], kind: type | None = None, fresh: Callable[[Any], str] | None = None):
        self.items, self.position = list(items), 0
        self.kind, self.fresh = kind, fresh

    def python_type(self):
        return self.kind or type(iter([]))

    def next(self) -> Value | None:
        if self.position >= len(self.items):
            return None
        self.position += 1
        return self.items[self.position - 1]

    def unpack(self, state) -> list[Value]:
        rest = self.items[self.position:]
        self.position = len(self.items)
        return rest

    def reconstruct(self, writer) -> str:
        if self.fresh is not None:
            return f"{writer.constant(iterator_at)}({self.fresh(writer)}, {self.position})"
        rest = ", ".join(writer.value(i) for i in self.items[self.position:])
        return f"iter([{rest}])"


def iterator_at(iterator, position: int):
    """`iterator` once it has produced `position` items (an iterator rebuilt at a graph break)."""
    for _ in range(position):
        next(iterator)
    return iterator
