"""`collections.deque` built by the traced code: a real deque of trackers.

Holding the trackers in a real deque (with the same maxlen) gives Python's own semantics for everything
that moves items without looking at them: appends and pops at both ends, rotate, maxlen trimming,
negative indices, the IndexError of an empty pop. Methods that compare items (count, index, remove)
need the items' values, so they run on deques of constants only. A deque from outside the frame is not
modelled (a graph break): its mutations would need writing back.
"""
from __future__ import annotations

import collections

from kiln.capture.breaks import GraphBreak
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.containers import method_of
from kiln.capture.values.exceptions import raise_python
from kiln.capture.values.iterators import iterator_of

_TAKE_ITERABLES = frozenset({"extend", "extendleft"})
_COMPARE_ITEMS = frozenset({"count", "index", "remove"})


class DequeValue(Value):
    def __init__(self, items: list[Value], maxlen: int | None = None):
        self.items: collections.deque = collections.deque(items, maxlen)

    def python_type(self) -> type:
        return collections.deque

    def unpack(self, state) -> list[Value]:
        return list(self.items)

    def length(self, state) -> int:
        return len(self.items)

    def truth(self, state) -> bool:
        return bool(self.items)

    def getattr(self, state, name: str) -> Value:
        if name == "maxlen":
            return ConstantValue(self.items.maxlen)
        return method_of(self, collections.deque, name)

    def getitem(self, state, key: Value) -> Value:
        return self._run(lambda: self.items[key.as_constant()])

    def setitem(self, state, key: Value, value: Value) -> None:
        self._run(lambda: self.items.__setitem__(key.as_constant(), value))

    def delitem(self, state, key: Value) -> None:
        self._run(lambda: self.items.__delitem__(key.as_constant()))

    def call_method(self, state, name: str, args: list[Value], kwargs: dict) -> Value:
        if kwargs:
            raise GraphBreak("unsupported_call", f"deque.{name} with keyword arguments")
        if name == "copy":
            return DequeValue(list(self.items), self.items.maxlen)
        if name in _COMPARE_ITEMS:
            return self._compare(name, args)
        if name in _TAKE_ITERABLES:
            real_args = [iterator_of(state, args[0]).unpack(state)]
        elif name in ("append", "appendleft"):
            real_args = [args[0]]
        else:
            real_args = [a.as_constant() for a in args]  # rotate(n), insert(i, x) below, pop(), clear()...
            if name in ("insert", "__setitem__"):  # (position, item): the item stays a tracker
                real_args = [args[0].as_constant(), args[1]]
        result = self._run(lambda: getattr(self.items, name)(*real_args))
        return result if isinstance(result, Value) else ConstantValue(result)

    def _compare(self, name: str, args: list[Value]) -> Value:
        """count/index/remove: Python's, on the items' constant values (a deque of tensors breaks)."""
        if not all(i.realize().is_constant() for i in self.items) or not all(a.is_constant() for a in args):
            raise GraphBreak("unsupported_call", f"deque.{name} on items that are not constants")
        values = collections.deque(i.as_constant() for i in self.items)
        result = self._run(lambda: getattr(values, name)(*(a.as_constant() for a in args)))
        if name == "remove":  # `values` lost the first equal item: drop the tracker at the same position
            index = next((i for i, v in enumerate(values) if v is not self.items[i].as_constant()), len(values))
            del self.items[index]
        return ConstantValue(result)

    def _run(self, operation):
        """Run `operation` on the real deque; the exception Python raises becomes the traced code's."""
        try:
            return operation()
        except (IndexError, TypeError, ValueError) as e:
            raise raise_python(type(e), *e.args) from e

    def reconstruct(self, writer) -> str:
        items = ", ".join(writer.value(i) for i in self.items)
        return f"{writer.constant(collections.deque)}([{items}], {self.items.maxlen!r})"

    def __repr__(self) -> str:
        return f"Deque({list(self.items)})"
