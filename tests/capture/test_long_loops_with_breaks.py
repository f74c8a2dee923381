"""A loop whose body breaks the graph resumes in a continuation per iteration; the continuations run one after
the other from the caller (a trampoline), not each inside the one before (found by CPython's test_functools
and test_set loops with random numbers). Before, each iteration nested a Python frame, and a loop of a few
thousand iterations raised RecursionError where eager runs on. (A break inside `with torch.no_grad():` still
calls its continuation inside the handler that leaves the block when it raises, so there it still nests.)
Each case compares with eager.
"""
from __future__ import annotations

import random

import pytest
import torch

from support.capture import check


def counted_loop_with_a_break(x):
    for _ in range(3000):
        random.random()  # an unmodelled call: a graph break per iteration
        x = x + 1
    return x


def while_loop_with_a_break(x):
    n = 0
    while n < 2500:
        random.random()
        x = x * 1.0001
        n += 1
    return x, n


@pytest.mark.allows_fallback("graph_break: random.random() breaks the graph on purpose")
@pytest.mark.parametrize("fn", [counted_loop_with_a_break, while_loop_with_a_break],
                         ids=lambda f: f.__name__)
def test_thousands_of_iterations_with_a_break_do_not_recurse(fn):
    random.seed(0)
    check(fn, torch.randn(3), second=False)
