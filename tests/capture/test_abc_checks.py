"""isinstance/issubclass against an ABC of a class whose attributes traced code wrote (found by CPython's
test_collections): the ABC reads the class's attributes (`Sized` looks for `__len__`) and caches its answer
for good, so capture must not ask before the write is replayed. Before, the answer was the class's before the
write (`False`) and the ABC's cache kept that wrong answer for eager code too. Each case compares with eager.
"""
from __future__ import annotations

import collections.abc

import pytest
import torch

from support.capture import check


def _sized_after_write(x, make_class):
    cls = make_class()
    cls.__len__ = lambda self: 3
    return x + 1, isinstance(cls(), collections.abc.Sized), issubclass(cls, (collections.abc.Iterable,
                                                                          collections.abc.Sized))


def argument_class_then_write(x, cls):
    return _sized_after_write(x, lambda: cls)


def three_argument_type_then_write(x):
    return _sized_after_write(x, lambda: type("Box", (), {"__hash__": None}))


class Base:
    pass


class Box(Base):
    pass


def plain_class_check_after_write(x):
    Box.size = 3  # an ordinary class answers from its MRO: no break needed
    return x * Box.size, isinstance(Box(), Base), issubclass(Box, (int, Base))


@pytest.mark.allows_fallback("graph_break: the ABC check runs natively once the class write is replayed")
def test_abc_check_sees_the_written_argument_class():
    check(argument_class_then_write, torch.randn(3), type("Box", (), {}), second=False)


@pytest.mark.allows_fallback("graph_break: type() with three arguments and the ABC check run natively")
def test_abc_check_sees_the_written_new_class():
    check(three_argument_type_then_write, torch.randn(3), second=False)  # a new class per call


def test_plain_class_check_stays_in_the_graph():
    check(plain_class_check_after_write, torch.randn(3), graphs=1)
