"""Builtins called in forms kiln's handlers do not model, or that eager rejects (found by CPython's
test_builtin): the call runs natively after a break, so it returns or raises what eager does, instead of
the capture crashing on the handler's own signature.
"""
from __future__ import annotations

import functools

import torch

from support.capture import check


def rejected_arity_inside_try(x):
    for call in (lambda: all(), lambda: any(), lambda: delattr(len)):
        try:
            call()
        except TypeError:
            x = x + 1
    return x


def three_argument_type(x):
    Point = type("Point", (), {"scale": 3.0})
    return x * Point.scale


def iter_with_a_sentinel(x):
    items = iter([1.0, 2.0, 0.0, 4.0])
    return [x * v for v in iter(items.__next__, 0.0)]


def test_arity_errors_are_eagers():
    check(rejected_arity_inside_try, torch.randn(3))


def test_three_argument_type():
    check(three_argument_type, torch.randn(3), second=False)  # a new class per call: the continuation recompiles


def test_iter_with_a_sentinel():
    check(iter_with_a_sentinel, torch.randn(3))


def equality_of_c_objects(x):
    key = functools.cmp_to_key(lambda a, b: (a > b) - (a < b))
    x = x + 1
    same = key(3) == key(3)  # KeyWrapper's own __eq__, not identity
    bound = x.add == x.add  # bound methods compare by self and function
    return x, same, bound, key(3) != key(4)


def test_equality_of_objects_with_their_own_c_eq_is_eagers():
    check(equality_of_c_objects, torch.randn(3))
