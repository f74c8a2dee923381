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
    (float_sign, 0.0, float("nan")),
    (float_sign, -0.0, float("nan")),
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


class _Name(str):
    """A string subclass: equal to its text, yet another type."""


# (expected, value) pairs for the flat check: lists and tuples whose items `==` compares exactly
FLAT_PAIRS = [
    ((1, "a", None), (1, "a", None)),
    ((1, "a", None), (1.0, "a", None)),
    ((1, "a", None), (True, "a", None)),
    ((1, "a", None), [1, "a", None]),
    ((1, "a", None), (1, "a")),
    ((1, "a", None), (1, "a", None, 2)),
    ((2.5, b"x"), (2.5, b"x")),
    ((2.5, b"x"), (2.5 + 0j, b"x")),
    ((2.5, b"x"), (float("nan"), b"x")),
    (["p", "q"], ["p", "q"]),
    (["p", "q"], ["p", _Name("q")]),
    ([False], [0]),
    ([], []),
    ([], ()),
]


@pytest.mark.parametrize("expected,value", FLAT_PAIRS, ids=[f"{e!r}-{v!r}" for e, v in FLAT_PAIRS])
def test_the_flat_items_check_answers_as_same_constant(expected, value):
    from kiln.capture import guards

    assert "___same_items" in guards.constant_check("x", expected, "c")
    assert guards.same_items(value, expected) == guards.same_constant(value, expected)


@pytest.mark.parametrize("expected", [(0.0,), (float("nan"),), ((1, 2),), (frozenset({1}),), (1 + 0j,)])
def test_items_that_equal_values_can_differ_from_keep_the_full_check(expected):
    from kiln.capture import guards

    assert "___same_constant" in guards.constant_check("x", expected, "c")


def string_keys(x, d):
    return x + len(d), [type(k).__name__ for k in d]


def test_dict_keys_of_a_string_subclass_recompile():
    compiled = kiln.compile(string_keys, backend="eager")
    plain, subclass = {"a": 1, "b": 2}, {"a": 1, _Name("b"): 2}
    assert_same(string_keys(INTS, plain), compiled(INTS, plain))
    captures = len(context_of(compiled).records)
    assert_same(string_keys(INTS, subclass), compiled(INTS, subclass))
    recaptured = len(context_of(compiled).records)
    assert recaptured > captures
    assert_same(string_keys(INTS, plain), compiled(INTS, plain))
    assert len(context_of(compiled).records) == recaptured  # the first entry still serves plain strings
