"""Iterating a list during capture as Python does: live, item by item (kiln/capture/values/iterators.py).

A list iterator reads the list at each step (items appended while iterating are reached) and, once
exhausted, stays exhausted even if the list grows; at a graph break it resumes over the same list object.
Found by CPython's list tests (tests/cpython); each case compares with eager.
"""
from __future__ import annotations

import torch

from support.capture import check


def exhausted_stays_exhausted(x):
    a = [1, 2, 3]
    exhausted, fresh = iter(a), iter(a)
    for _ in exhausted:
        next(fresh)
    a.append(9)
    return x + len(list(exhausted)) * 10 + sum(fresh)


def appends_while_iterating(x):
    items = [1, 2]
    for item in items:
        if len(items) < 5:
            items.append(item * 2)
        x = x + item
    return x, items


def iterator_across_a_break(x):
    a = [1.0, 2.0, 3.0]
    it = iter(a)
    first = next(it)
    print(end="")  # a graph break with the iterator alive
    a.append(4.0)
    return x * first + sum(it), a


def shared_iterator_in_zip(x):
    a = [1, 2, 3, 4]
    it = iter(a)
    return [x * p + q for p, q in zip(it, it)]


def test_exhausted_list_iterator_stays_exhausted():
    check(exhausted_stays_exhausted, torch.randn(3), graphs=1, fullgraph=True)


def test_items_appended_while_iterating_are_reached():
    check(appends_while_iterating, torch.randn(3), graphs=1, fullgraph=True)


def test_list_iterator_resumes_after_a_graph_break_over_the_same_list():
    check(iterator_across_a_break, torch.randn(3), graphs=2)


def test_one_list_iterator_shared_by_zip():
    check(shared_iterator_in_zip, torch.randn(3), graphs=1, fullgraph=True)
