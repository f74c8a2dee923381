"""A value found at a path into the user's objects (`d['k']`, `obj.w`) and still live at a graph break is read
before the break's replayed side effects (found by CPython's test_dict mapping tests): an effect may replace
or delete what the path goes through. Before, the continuation read the path after the effects: the new value
instead of the old one (a silent wrong answer), or a KeyError for a deleted key. A list that holds itself
(functools' Python lru_cache links) is rebuilt as one object, where its rebuilding recursed without end. Each
case compares with eager.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.capture import check


class Holder:
    def __init__(self):
        self.w = 1.0


def replaced_item(x, d):
    old = d["k"]
    d["k"] = 9.0
    print("a graph break: `old` goes to the continuation")
    return x * old, d["k"]


def deleted_items(x, d):
    first, second = d["a"], d["b"]
    d.popitem()
    del d["a"]
    print("a graph break: both go to the continuation")
    return x + first + second, dict(d)


def replaced_attribute(x, obj):
    old = obj.w
    obj.w = 5.0
    print("a graph break: `old` goes to the continuation")
    return x * old, obj.w


@pytest.mark.allows_fallback("graph_break: print() breaks the graph on purpose")
@pytest.mark.parametrize("fn, make", [(replaced_item, lambda: {"k": 2.0}),
                                      (deleted_items, lambda: {"a": 1.0, "b": 2.0, "c": 3.0})],
                         ids=["replaced_item", "deleted_items"])
def test_items_are_read_before_effects(fn, make):
    check(fn, torch.randn(3), make(), second=False)  # check compares the dict after the call too


@pytest.mark.allows_fallback("graph_break: print() breaks the graph on purpose")
def test_attributes_are_read_before_effects():
    x, eager_obj, compiled_obj = torch.randn(3), Holder(), Holder()
    expected = replaced_attribute(x, eager_obj)
    actual = kiln.compile(replaced_attribute, backend="eager")(x, compiled_obj)
    torch.testing.assert_close(actual[0], expected[0])
    assert actual[1:] == expected[1:] and vars(compiled_obj) == vars(eager_obj)


def cyclic_lists(x):
    # the links of functools' Python lru_cache: a list that holds itself, rebuilt at a break as one object
    root = []
    root[:] = [root, root, None, None]
    a = [1.0]
    b = [a, 2.0]
    a.append(b)
    print("a graph break: the lists go to the continuation")
    return x * a[0], root[0] is root, root[1] is root, len(root), a[1] is b, b[0] is a


@pytest.mark.allows_fallback("graph_break: print() breaks the graph on purpose")
def test_lists_holding_themselves_are_rebuilt_as_one_object():
    check(cyclic_lists, torch.randn(3))
