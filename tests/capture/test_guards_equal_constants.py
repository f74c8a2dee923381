"""Constant guards tell apart values that Python calls equal: 1, 1.0, True and 1+0j; 0.0 and -0.0; NaN.

A program captured for `(1,)` computes `x + s[0]` as an int tensor and `type(s[0])` as int; for `(1.0,)` both
differ, though `(1,) == (1.0,)`. A guard comparing with `==` alone reused the first program for the second value,
a silent wrong answer (CPython's `test_functools.TestLRUPy.test_lru_with_types`: the pure-Python
`lru_cache(typed=True)` builds its key in `_make_key((3.0,), {}, True)`, which reused the capture made for
`(3,)`, so `square(3.0)` answered the cached int 9). Each case runs eager and kiln side by side on the first
value, then on an equal value of another type or sign: kiln must answer as eager and recompile for it.
"""
import math

import pytest
import torch
from test.support import import_helper

import kiln
from kiln.api import context_of
from support.capture import assert_same

INTS = torch.arange(3)


def first_item(x, s):
    return x + s[0], type(s[0])


def nested_item(x, s):
    return x * s[0][1], type(s[0][1])


def key_types(x, d):
    return x + 1, [type(k) for k in d]


def float_sign(x, s):
    return x + s, math.copysign(1.0, s), str(s)


def set_in_tuple(x, s):
    return x + min(s[0])


def tuple_in_set_in_tuple(x, s):
    return x + min(s[0])[1]


CASES = [
    (first_item, (1,), (1.0,)),
    (first_item, (1,), (True,)),
    (first_item, (1.0,), (1,)),
    (first_item, (1,), (1 + 0j,)),
    (first_item, (0.0,), (-0.0,)),
    (nested_item, ((0, 2),), ((0, 2.0),)),
    (key_types, {1: "a"}, {1.0: "a"}),
    (key_types, {1: "a", "b": 2}, {True: "a", "b": 2}),
    (float_sign, 0.0, -0.0),
    (float_sign, -0.0, 0.0),
    (float_sign, float("nan"), 2.0),
    (set_in_tuple, (frozenset({1}),), (frozenset({1.0}),)),
    (tuple_in_set_in_tuple, (frozenset({(1, 2)}),), (frozenset({(1, 2.0)}),)),
]


@pytest.mark.parametrize("fn,first,second", CASES,
                         ids=[f"{fn.__name__}-{first!r}-{second!r}" for fn, first, second in CASES])
def test_an_equal_constant_of_another_type_or_sign_recompiles(fn, first, second):
    compiled = kiln.compile(fn, backend="eager")
    assert_same(fn(INTS, first), compiled(INTS, first))
    captures = len(context_of(compiled).records)
    assert_same(fn(INTS, second), compiled(INTS, second))
    assert len(context_of(compiled).records) == 2 * captures  # each frame recaptured for the second value
    assert_same(fn(INTS, first), compiled(INTS, first))  # the first entries still serve the first value
    assert len(context_of(compiled).records) == 2 * captures


def test_the_same_constant_reuses_its_entry():
    compiled = kiln.compile(first_item, backend="eager")
    for value in [(1.5,), (1.5,), (-0.0,), (-0.0,)]:
        assert_same(first_item(INTS, value), compiled(INTS, value))
    assert len(context_of(compiled).records) == 2


def typed_squares(module):
    """CPython's TestLRU.test_lru_with_types: a typed cache keeps 3 and 3.0 apart, with and without a bound."""
    out = []
    for maxsize in (None, 128):
        @module.lru_cache(maxsize=maxsize, typed=True)
        def square(x):
            return x * x
        out += [square(3), square(3.0), square(x=3), square(x=3.0), square(3.0)]
        out += [type(v) for v in out[-5:]]
    return out


def test_pure_python_typed_lru_cache_keeps_equal_arguments_of_two_types_apart():
    functools_py = import_helper.import_fresh_module("functools", blocked=["_functools"])
    compiled = kiln.compile(typed_squares, backend="eager")
    assert compiled(functools_py) == typed_squares(functools_py)
