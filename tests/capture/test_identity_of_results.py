"""Operations CPython answers with their operand itself (found by CPython's test_set and test_list):
`frozenset(fs)`, `tuple(t)`, `t * 1`, `t + ()`, `() + t`, `s + ''` for an exact frozenset, tuple or str return
that very object, so `is` and `id()` see one object, as in eager; and a frozenset passed to a continuation is
rebuilt once, not once per use. Before, each was an equal copy: `frozenset(fs) is fs` was False.
"""
from __future__ import annotations

import pytest
import torch

from support.capture import check


def identities(x):
    fs = frozenset(range(3))
    t = tuple(range(3))
    s = "ab" + "cd"
    items = [1]
    return (x + 1, frozenset(fs) is fs, tuple(t) is t, t * 1 is t, 1 * t is t, t + () is t, () + t is t,
            s * 1 is s, s + "" is s, items * 1 is items, t * 2 is t)


def identities_across_a_break(x):
    fs = frozenset(range(3))
    same = frozenset(fs)
    t = tuple(range(3))
    once = t * 1
    print("a graph break: the values go to the continuation")
    return x + 1, id(same) == id(fs), same is fs, once is t


def test_operand_itself_in_the_graph():
    check(identities, torch.randn(3), graphs=1)


@pytest.mark.allows_fallback("graph_break: print() breaks the graph on purpose")
def test_operand_itself_across_a_break():
    # id() in the continuation guards the identity of a frozenset each call makes anew: no second call
    check(identities_across_a_break, torch.randn(3), second=False)
