"""Lazy iterators during capture: generators, zip, enumerate, map and filter, one item per next().

Python computes these one item at a time, interleaved with the code consuming them: a generator's body runs up
to its next `yield` only when asked, `map`'s function is called per item, `zip(it, it)` pairs consecutive items.
Computing them all up front reorders side effects (a generator's appends before the loop body's), runs code
eager never runs (the rest of a partially consumed generator) and gets shared iterators wrong. So each of these
trackers computes its next item on demand, from iterators it holds, exactly where eager does.

At a graph break, an iterator the continuation still needs is rebuilt from the rest of its inputs
(`zip(iter([...]), ...)`), so the continuation resumes at the exact position. A generator suspended inside its
body cannot be rebuilt: the frame then runs natively.
"""
from __future__ import annotations

import itertools
import types
from typing import Any

from kiln.capture.breaks import GraphBreak, Unresumable
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.containers import IteratorValue, ListValue, TupleValue, iterator_at
from kiln.capture.values.exceptions import ExceptionValue, TracedException, is_exception_class, raise_python
from kiln.capture.values.functions import BoundMethodValue


def iterator_of(state, value: Value) -> IteratorValue:
    """`iter(value)`: an iterator is its own iterator (shares its position); a list is iterated live (see
    ListIteratorValue); anything else is unpacked."""
    value = value.realize()
    if isinstance(value, IteratorValue):
        return value
    if hasattr(value, "iterator"):  # a user object: its own iterator, stepped lazily (values.objects)
        return value.iterator(state)
    if isinstance(value, ListValue) and value.python_type() is list:
        return ListIteratorValue(value)
    kind = _builtin_iterator_type(value, iter)
    if kind is None:
        return IteratorValue(value.unpack(state))
    return IteratorValue(value.unpack(state), kind, lambda writer: f"iter({writer.value(value)})")


def reversed_of(state, value: Value) -> IteratorValue:
    """`reversed(value)`: a list's reverse iterator reads the list live (as `iter` does); that of another
    builtin sequence is eager's type over its items; a user sequence's items, reversed."""
    value = value.realize()
    if isinstance(value, ListValue) and value.python_type() is list:
        return ReversedListIteratorValue(value)
    items = list(reversed(value.unpack(state)))
    kind = _builtin_iterator_type(value, reversed)
    if kind is None:
        return IteratorValue(items)
    return IteratorValue(items, kind, lambda writer: f"reversed({writer.value(value)})")


# Builtin containers whose iterator kiln rebuilds by iterating the container again: their empty instance,
# whose iterator (or reverse iterator) has the type eager's has
_EMPTY = {tuple: (), range: range(0), bytes: b"", frozenset: frozenset(), set: set(), dict: {},
          type({}.keys()): {}.keys(), type({}.values()): {}.values(), type({}.items()): {}.items()}


def _builtin_iterator_type(value: Value, make) -> type | None:
    """The type of `make(value)` (iter or reversed) for a builtin container, or None for anything else.
    A str's iterator type depends on its text (ASCII or not), so it is asked of the constant itself."""
    try:
        cls = value.python_type()
    except GraphBreak:
        return None
    try:
        if cls is str and value.is_constant():
            return type(make(value.as_constant()))
        return type(make(_EMPTY[cls])) if cls in _EMPTY else None
    except TypeError:  # not reversible (a set, a dict view before 3.8's rules)
        return None


class ListIteratorValue(IteratorValue):
    """`iter(a_list)`: Python's list iterator reads the list at each step, so items appended while iterating
    are seen, and once it has said StopIteration it stays exhausted even if the list grows. The list's own
    tracker is held (its writes are this iterator's items); rebuilt as an iterator over that same list,
    advanced to the position reached."""

    def __init__(self, source_list: ListValue):
        super().__init__([])
        self.items = source_list.items  # the list tracker's own item list: appends during capture show here
        self.source_list, self.exhausted = source_list, False

    def next(self) -> Value | None:
        if self.exhausted or self.position >= len(self.items):
            self.exhausted = True
            return None
        self.position += 1
        return self.items[self.position - 1]

    def unpack(self, state) -> list[Value]:
        rest = [] if self.exhausted else self.items[self.position:]
        self.position, self.exhausted = len(self.items), True
        return rest

    def reconstruct(self, writer) -> str:
        if self.exhausted:
            return "iter(())"
        return f"{writer.constant(list_iterator_at)}({writer.value(self.source_list)}, {self.position})"


class ReversedListIteratorValue(IteratorValue):
    """`reversed(a_list)`: Python's reverse iterator reads `list[index]` at each step, counting down from the
    length at creation; it stops for good at index -1 or once the list has shrunk below the index. Rebuilt
    as a reverse iterator over that same list, advanced to the index reached."""

    def __init__(self, source_list: ListValue):
        super().__init__([])
        self.items = source_list.items  # the list tracker's own item list, read live
        self.source_list, self.index = source_list, len(source_list.items) - 1

    def python_type(self):
        return type(reversed([]))

    def next(self) -> Value | None:
        if not 0 <= self.index < len(self.items):
            self.index = -1
            return None
        self.index -= 1
        return self.items[self.index + 1]

    def unpack(self, state) -> list[Value]:
        rest = []
        while (value := self.next()) is not None:
            rest.append(value)
        return rest

    def reconstruct(self, writer) -> str:
        return f"{writer.constant(reversed_list_at)}({writer.value(self.source_list)}, {self.index})"


def list_iterator_at(items: list, position: int):
    """A list iterator over `items` that has already produced `position` items (at a graph break)."""
    return iterator_at(iter(items), position)


def reversed_list_at(items: list, index: int):
    """A reverse iterator over `items` whose next item is `items[index]` (exhausted for -1)."""
    iterator = reversed(items)
    iterator.__setstate__(index)
    return iterator


class LazyIteratorValue(IteratorValue):
    """An iterator computing each item on next(): `step` gives the next one, None once exhausted."""

    def __init__(self, state):
        super().__init__([])
        self.state, self.exhausted = state, False

    def step(self) -> Value | None:
        raise NotImplementedError

    def next(self) -> Value | None:
        if self.exhausted:
            return None
        value = self.step()
        self.exhausted = value is None
        return value

    def unpack(self, state) -> list[Value]:
        items = []
        while (value := self.next()) is not None:
            items.append(value)
        return items

    def reconstruct(self, writer) -> str:
        if self.exhausted:
            return "iter(())"
        return self.rebuild(writer)

    def rebuild(self, writer) -> str:
        raise NotImplementedError


class ZipValue(LazyIteratorValue):
    def __init__(self, state, iterators: list[IteratorValue], strict: bool):
        super().__init__(state)
        self.iterators, self.strict = iterators, strict

    def python_type(self) -> type:
        return zip

    def step(self) -> Value | None:
        row = []
        for i, it in enumerate(self.iterators):
            value = it.next()
            if value is None:
                if self.strict and (i > 0 or any(other.next() is not None for other in self.iterators[1:])):
                    raise raise_python(ValueError, "zip() arguments have different lengths")
                return None
            row.append(value)
        return TupleValue(row) if row else None

    def rebuild(self, writer) -> str:
        inner = "".join(writer.value(it) + ", " for it in self.iterators)
        return f"zip({inner}strict={self.strict})"


class EnumerateValue(LazyIteratorValue):
    def __init__(self, state, iterator: IteratorValue, start: Any):
        super().__init__(state)
        self.iterator, self.count = iterator, start

    def python_type(self) -> type:
        return enumerate

    def step(self) -> Value | None:
        value = self.iterator.next()
        if value is None:
            return None
        self.count += 1
        return TupleValue([ConstantValue(self.count - 1), value])

    def rebuild(self, writer) -> str:
        return f"enumerate({writer.value(self.iterator)}, {self.count!r})"


class MapValue(LazyIteratorValue):
    def __init__(self, state, fn: Value, iterators: list[IteratorValue]):
        super().__init__(state)
        self.fn, self.iterators = fn, iterators

    def python_type(self) -> type:
        return map

    def step(self) -> Value | None:
        row = []
        for it in self.iterators:
            value = it.next()
            if value is None:
                return None
            row.append(value)
        return self.fn.call(self.state, row, {})

    def rebuild(self, writer) -> str:
        inner = ", ".join(writer.value(it) for it in self.iterators)
        return f"map({writer.value(self.fn)}, {inner})"


class FilterValue(LazyIteratorValue):
    def __init__(self, state, fn: Value, iterator: IteratorValue):
        super().__init__(state)
        self.fn, self.iterator = fn, iterator

    def python_type(self) -> type:
        return filter

    def step(self) -> Value | None:
        keeps_truthy = self.fn.realize().is_constant() and self.fn.as_constant() is None
        while (item := self.iterator.next()) is not None:
            test = item if keeps_truthy else self.fn.call(self.state, [item], {})
            if test.truth(self.state):
                return item
        return None

    def rebuild(self, writer) -> str:
        return f"filter({writer.value(self.fn)}, {writer.value(self.iterator)})"


def stop_iteration(iterator: IteratorValue) -> Exception:
    """The StopIteration an exhausted iterator raises; a generator's carries what it returned."""
    returned = getattr(iterator, "return_value", None)
    if returned is None or not returned.realize().is_constant() or returned.as_constant() is None:
        return raise_python(StopIteration)
    return raise_python(StopIteration, returned.as_constant())


class ChainValue(LazyIteratorValue):
    """`itertools.chain(*iterables)`: each iterable is made an iterator only when the previous one ends."""

    def __init__(self, state, iterables: list[Value]):
        super().__init__(state)
        self.iterables, self.current = list(iterables), None

    def python_type(self) -> type:
        return itertools.chain

    def step(self) -> Value | None:
        while True:
            if self.current is None:
                if not self.iterables:
                    return None
                self.current = iterator_of(self.state, self.iterables.pop(0))
            value = self.current.next()
            if value is not None:
                return value
            self.current = None

    def rebuild(self, writer) -> str:
        parts = ([self.current] if self.current is not None else []) + self.iterables
        return f"{writer.constant(itertools.chain)}({', '.join(writer.value(p) for p in parts)})"


class IsliceValue(LazyIteratorValue):
    """`itertools.islice(it, start, stop, step)`: takes from `it` only the items it needs, as eager does
    (an endless generator under islice must not be drained)."""

    def __init__(self, state, iterator: IteratorValue, bounds: slice):
        super().__init__(state)
        self.iterator = iterator
        self.next_index = bounds.start or 0  # index (in the underlying iterator) of the next item to give
        self.stop, self.stride, self.consumed = bounds.stop, bounds.step or 1, 0

    def python_type(self) -> type:
        return itertools.islice

    def step(self) -> Value | None:
        if self.stop is not None and self.next_index >= self.stop:
            return None
        while self.consumed <= self.next_index:
            value = self.iterator.next()
            if value is None:
                return None
            self.consumed += 1
        self.next_index += self.stride
        return value

    def rebuild(self, writer) -> str:
        skip = self.next_index - self.consumed
        stop = None if self.stop is None else max(self.stop - self.consumed, skip)
        return f"{writer.constant(itertools.islice)}({writer.value(self.iterator)}, {skip}, {stop}, {self.stride})"


class CountValue(LazyIteratorValue):
    """`itertools.count(start, step)`: endless, so it can only be lazy."""

    def __init__(self, state, start, step):
        super().__init__(state)
        self.value, self.stride = start, step

    def python_type(self) -> type:
        return itertools.count

    def step(self) -> Value | None:
        # Python's count yields `start` itself, then adds the step (count(10, 2.5) gives 10, then 12.5):
        # going back from the next value by subtraction would make the first item a float
        current, self.value = self.value, self.value + self.stride
        return ConstantValue(current)

    def rebuild(self, writer) -> str:
        return f"{writer.constant(itertools.count)}({writer.constant(self.value)}, {writer.constant(self.stride)})"


class RepeatValue(LazyIteratorValue):
    """`itertools.repeat(obj, times)`: the same object, `times` times (None: endlessly)."""

    def __init__(self, state, item: Value, times: int | None):
        super().__init__(state)
        self.item, self.times = item, times

    def python_type(self) -> type:
        return itertools.repeat

    def step(self) -> Value | None:
        if self.times is not None:
            if self.times <= 0:
                return None
            self.times -= 1
        return self.item

    def rebuild(self, writer) -> str:
        times = "" if self.times is None else f", {self.times}"
        return f"{writer.constant(itertools.repeat)}({writer.value(self.item)}{times})"


class WhileValue(LazyIteratorValue):
    """`itertools.takewhile(pred, it)` (`taking`) or `dropwhile(pred, it)`: `pred` runs per item, as in eager."""

    def __init__(self, state, predicate: Value, iterator: IteratorValue, taking: bool):
        super().__init__(state)
        self.predicate, self.iterator, self.taking, self.switched = predicate, iterator, taking, False

    def python_type(self) -> type:
        return itertools.takewhile if self.taking else itertools.dropwhile

    def step(self) -> Value | None:
        while (item := self.iterator.next()) is not None:
            if self.switched:  # dropwhile past its prefix: every item
                return item
            keep = self.predicate.call(self.state, [item], {}).truth(self.state)
            if self.taking:
                return item if keep else None
            if not keep:
                self.switched = True
                return item
        return None

    def rebuild(self, writer) -> str:
        if self.switched:
            return writer.value(self.iterator)
        return f"{writer.constant(self.python_type())}({writer.value(self.predicate)}, {writer.value(self.iterator)})"


class PairwiseValue(LazyIteratorValue):
    """`itertools.pairwise(it)`: overlapping pairs, holding the last item between calls."""

    def __init__(self, state, iterator: IteratorValue):
        super().__init__(state)
        self.iterator, self.previous = iterator, None

    def python_type(self) -> type:
        return itertools.pairwise

    def step(self) -> Value | None:
        if self.previous is None:
            self.previous = self.iterator.next()
            if self.previous is None:
                return None
        current = self.iterator.next()
        if current is None:
            return None
        pair, self.previous = TupleValue([self.previous, current]), current
        return pair

    def rebuild(self, writer) -> str:
        inner = writer.value(self.iterator)
        if self.previous is not None:  # the held item comes first again
            inner = f"{writer.constant(itertools.chain)}(({writer.value(self.previous)},), {inner})"
        return f"{writer.constant(itertools.pairwise)}({inner})"


def _thrown(args: list[Value]) -> ExceptionValue:
    """The exception `gen.throw(typ[, val[, tb]])` or `gen.throw(exc)` raises."""
    first = args[0].realize()
    if isinstance(first, ExceptionValue):
        return first
    value = args[1].realize() if len(args) > 1 else None
    if isinstance(value, ExceptionValue):
        return value
    cls = getattr(first, "cls", None)  # a ClassValue
    if is_exception_class(cls) and (value is None or (value.is_constant() and value.as_constant() is None)):
        return ExceptionValue(cls, [])
    raise GraphBreak("unsupported_call", f"generator.throw({first}, ...)")


class GeneratorValue(LazyIteratorValue):
    """A generator made by an inlined generator function (a genexpr too): its frame runs to the next `yield`
    on each next(), suspended in between with its stack and locals, as CPython's does."""

    def __init__(self, state, frame, fn: Value, args: list[Value], kwargs: dict[str, Value]):
        super().__init__(state)
        self.frame, self.fn, self.args, self.kwargs = frame, fn, args, kwargs
        self.started = False
        self.return_value: Value | None = None  # what its `return` gave, once it ran to the end
        frame.is_generator = True

    def python_type(self) -> type:
        return types.GeneratorType

    def step(self) -> Value | None:
        return self.send(ConstantValue(None))

    def send(self, value: Value) -> Value | None:
        """Resume the frame with `value` as the result of its `yield`; the next yielded value, None at its end."""
        if not self.started and not (value.realize().is_constant() and value.as_constant() is None):
            raise raise_python(TypeError, "can't send non-None value to a just-started generator")
        if self.started:
            self.frame.push(value)
        self.started = True
        return self._resume()

    def throw(self, exc: TracedException) -> Value | None:
        """Raise `exc` at the `yield` the frame is suspended at (`gen.throw`); the next yielded value, None at
        its end. A generator not started, or finished, raises it at once, as CPython's does."""
        if not self.started or self.exhausted:
            self.exhausted = True
            raise exc
        return self._resume(throw=exc)

    def _resume(self, throw: TracedException | None = None) -> Value | None:
        """Run the frame to its next `yield` (that value) or its end (None; the returned value is kept)."""
        try:
            result = self.frame.run(throw=throw)
        except Exception:
            self.exhausted = True
            raise
        if self.frame.suspended:
            self.frame.suspended = False
            return result
        self.exhausted, self.return_value = True, result
        return None

    def close(self) -> None:
        """`gen.close()`: GeneratorExit at the `yield`; the generator must end (or raise) rather than yield."""
        try:
            if self.throw(TracedException(ExceptionValue(GeneratorExit, []))) is not None:
                raise raise_python(RuntimeError, "generator ignored GeneratorExit")
        except TracedException as e:
            if not issubclass(e.value.cls, (GeneratorExit, StopIteration)):
                raise

    def getattr(self, state, name: str) -> Value:
        if name in ("send", "__next__", "throw", "close"):
            return BoundMethodValue(self, name)
        raise GraphBreak("unsupported_object", f"attribute {name!r} of a generator")

    def call_method(self, state, name: str, args: list[Value], kwargs: dict) -> Value:
        if name == "close":
            self.close()
            return ConstantValue(None)
        if name == "throw":
            value = self.throw(TracedException(_thrown(args)))
        else:
            value = self.next() if name == "__next__" else self.send(args[0]) if not self.exhausted else None
        if value is None:
            raise stop_iteration(self)
        return value

    def rebuild(self, writer) -> str:
        if self.started:
            raise Unresumable("unsupported_object", "a generator suspended inside its body at a graph break")
        args = [writer.value(a) for a in self.args] + [f"{k}={writer.value(v)}" for k, v in self.kwargs.items()]
        return f"{writer.value(self.fn)}({', '.join(args)})"

    def __repr__(self) -> str:
        return f"Generator({self.frame.code.co_name})"
