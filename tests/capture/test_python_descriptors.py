"""Attributes served by descriptors written in Python, and partial objects carrying attributes of their own.

`obj.method` where the class holds a `functools.partialmethod` (or any Python descriptor whose `__get__` makes a
new object per read) was read natively and guarded by the identity of the object read, which the next call never
gave again: a recompile per call. Its `__get__` is traced now; it binds the function it holds
(`function.__get__`) and writes `__self__` on the partial it makes, which the partial keeps (CPython's
test_functools `TestPartialMethod.test_bound_method_introspection`). A descriptor that caches
(`functools.cached_property`) keeps being read natively. Each case compares with eager, and calls three times
with one capture, as torch.compile compiles each once.
"""
import functools

import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import assert_same


def capture(*args, **kw):
    return args, kw


class Scaler:
    both = functools.partialmethod(capture, 3, b=4)
    nested = functools.partialmethod(both, 5)

    def __init__(self, factor):
        self.factor = factor

    def _scale(self, x, offset):
        return x * self.factor + offset

    shifted = functools.partialmethod(_scale, offset=1.0)

    @functools.cached_property
    def doubled(self):
        return self.factor * 2


class Bound:
    """A descriptor of its own: each read makes a new closure over the instance."""

    def __init__(self, fn):
        self.fn = fn

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        return lambda *args: self.fn(obj, *args)


class WithBound:
    factor = 3.0
    times = Bound(lambda self, x: x * self.factor)


SCALER = Scaler(2.0)
WITH_BOUND = WithBound()


def partialmethod_call(x):
    return SCALER.shifted(x), SCALER.both(x)[0][1:]


def partialmethod_self(x):
    method = SCALER.both
    return x + 1, method.__self__ is SCALER, method.args, SCALER.nested()[0][1:]


def own_descriptor(x):
    return WITH_BOUND.times(x) + 1


def cached_property_read(x):
    return x * SCALER.doubled


def partial_attributes(x):
    p = functools.partial(capture, 1)
    p.tag = "t"
    try:
        p.func = capture
    except AttributeError as e:
        error = str(e)
    return x + 1, p.tag, p(2), error


@pytest.mark.parametrize("fn", [partialmethod_call, partialmethod_self, own_descriptor, cached_property_read,
                                partial_attributes])
def test_descriptor_read_compiles_once_and_matches_eager(fn):
    compiled = kiln.compile(fn, backend="eager")
    for _ in range(3):
        x = torch.randn(3)
        assert_same(fn(x), compiled(x))
    assert len(context_of(compiled).records) == 1, [r.recompile_reason for r in context_of(compiled).records]


def test_partial_made_with_attributes_is_returned_with_them():
    def make(x):
        p = functools.partial(capture, x)
        p.note = "kept"
        return p

    compiled = kiln.compile(make, backend="eager")
    made = compiled(torch.ones(1))
    assert made.note == "kept" and made()[0][0].item() == 1.0
