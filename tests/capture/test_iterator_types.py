"""The iterators capture makes are eager's (found by CPython's test_list, test_itertools): `type(it)` is the
type eager's iterator has (`tuple_iterator`, `dict_itemiterator`, `itertools.combinations`, ...), and at a
graph break the iterator is rebuilt as that type at the position reached, so `sys.getsizeof`, pickling and
`type()` in the continuation answer as eager. `reversed(a_list)` reads the list live, as Python's reverse
iterator does, so writes to the list after `reversed()` are seen. Before, each was a list iterator over a
snapshot: silently the wrong type, and the wrong items after a write. Each case compares with eager.
"""
from __future__ import annotations

import itertools
import pickle
import sys

import pytest
import torch

from support.capture import check


def iterator_types(x):
    d = {"a": 1, "b": 2}
    its = (iter((1, 2)), iter(range(3)), iter(d), iter(d.values()), iter(d.items()), iter("ab"), iter("é"),
           iter(frozenset({1})), reversed((1, 2)), reversed(range(3)), reversed([1, 2]), iter(b"ab"))
    return x + 1, [type(it) for it in its]


def itertools_types(x):
    its = (itertools.combinations("abc", 2), itertools.permutations([1, 2]), itertools.product("ab", repeat=2))
    return x * 2, [type(it) for it in its], [list(it) for it in its]


def reversed_list_reads_live(x):
    items = [1.0, 2.0, 3.0, 4.0]
    backwards = reversed(items)
    items[0] = 10.0
    first = next(backwards)
    items.pop()  # the index now points past the end: the iterator stops, as Python's does
    rest = list(backwards)
    grown = [1.0, 2.0]
    upward = reversed(grown)
    grown.append(5.0)  # appended after reversed(): not seen
    return x * first, rest, list(upward)


def count_items_are_pythons(x):
    # count(10, 2.5) yields the int 10 first, then floats; a float step accumulates its rounding as in eager
    by_quarters, by_tenths = itertools.count(10, 2.5), itertools.count(1, 0.1)
    return x + 1, [next(by_quarters) for _ in range(3)], [next(by_tenths) for _ in range(4)]


CASES = {f.__name__: f for f in (iterator_types, itertools_types, reversed_list_reads_live, count_items_are_pythons)}


@pytest.mark.parametrize("name", CASES)
def test_iterators_are_eagers(name):
    check(CASES[name], torch.randn(3), graphs=1)


def advanced_then_broken(x):
    combos = itertools.combinations("abcd", 2)
    pairs = iter((("a", 1), ("b", 2), ("c", 3)))
    numbers = [4, 5, 6, 7]
    backwards = reversed(numbers)
    counter = itertools.count(10, 2.5)
    next(combos), next(pairs), next(backwards), next(counter)
    print("a graph break: the iterators are rebuilt for the continuation")
    sizes = sys.getsizeof(combos) > 0, type(combos), type(pairs), type(backwards)
    numbers[0] = 40  # the rebuilt reverse iterator reads the same list
    return x + 1, sizes, list(combos), list(pairs), list(backwards), repr(counter), next(counter)


def pickled_reverse_iterator(x):
    original = [4, 5, 6, 7]
    backwards = reversed(original)
    next(backwards)
    copy, copied_list = pickle.loads(pickle.dumps((backwards, original)))
    copied_list[:] = [10, 11, 12, 13, 14]
    return x + 1, type(copy), list(copy)


@pytest.mark.allows_fallback("graph_break: print() and pickle break the graph on purpose")
@pytest.mark.parametrize("fn", [advanced_then_broken, pickled_reverse_iterator], ids=lambda f: f.__name__)
def test_iterators_rebuilt_at_a_break_are_eagers(fn):
    check(fn, torch.randn(3))
