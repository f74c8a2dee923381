"""Functions made inside the compiled function (found by CPython's test_contextlib and test_functools): their
attributes read and written during capture as CPython's function object answers (`__doc__`, `__qualname__`,
`__annotations__`, `f.attr = ...`, a missing attribute's AttributeError), `functools.wraps` copying all of
`WRAPPER_ASSIGNMENTS`, `__dict__` and `__wrapped__`, and all of it kept when the function is rebuilt after a
graph break (with its keyword-only defaults). Before, `@contextmanager` functions lost their docstring and a
wrapped function's attributes were read as missing. Each case compares with eager.
"""
from __future__ import annotations

import contextlib
import functools

import pytest
import torch

from support.capture import check


def docstring_and_names(x):
    def scale(v: torch.Tensor, *, by=2.0):
        """Scales v."""
        return v * by
    return scale(x), scale.__doc__, scale.__qualname__, scale.__module__, scale.__annotations__


def written_attributes(x):
    def step(v):
        return v + 1
    step.calls = 3
    step.__doc__ = "set later"
    return step(x) * step.calls, step.__doc__, hasattr(step, "missing"), getattr(step, "missing", 7)


def wraps_copies_everything(x):
    def inner(v: torch.Tensor, *, k=1.0):
        """Inner's doc."""
        return v * k
    inner.tag = "kept"

    @functools.wraps(inner)
    def outer(*args, **kwargs):
        return inner(*args, **kwargs) + 1
    return (outer(x, k=3.0), outer.__name__, outer.__qualname__, outer.__doc__, outer.__annotations__,
            outer.tag, outer.__wrapped__ is inner)


def wraps_selected_attributes(x):
    def inner(v):
        """Inner's doc."""
        return v
    inner.tag = "not copied"

    @functools.wraps(inner, assigned=("__doc__",), updated=())
    def outer(v):
        return inner(v) * 2
    return outer(x), outer.__name__, outer.__doc__, hasattr(outer, "tag"), outer.__wrapped__ is inner


def wraps_a_builtin(x):
    @functools.wraps(max)
    def biggest(*args):
        return max(*args)
    return x + biggest(1, 3), biggest.__name__, biggest.__wrapped__ is max


def contextmanager_keeps_its_doc(x):
    @contextlib.contextmanager
    def scaled(v):
        """Whee!"""
        yield v * 2
    with scaled(x) as y:
        pass
    return y, scaled.__doc__, scaled.__name__


def missing_attribute_caught(x):
    def f():
        pass
    try:
        f.nope  # noqa: B018 - the read is what raises
    except AttributeError as e:
        return x + 1, str(e)
    return x, ""


def rebuilt_after_a_break(x):
    def inner(v, *, k=2.0):
        """Inner's doc."""
        return v * k
    inner.tag = "kept"

    @functools.wraps(inner)
    def outer(*args, **kwargs):
        return inner(*args, **kwargs)
    print("a graph break: the functions are rebuilt for the continuation")
    return outer(x), outer(x, k=3.0), outer.__doc__, outer.tag, outer.__wrapped__ is inner, inner.__kwdefaults__


ONE_GRAPH = {f.__name__: f for f in (docstring_and_names, written_attributes, wraps_copies_everything,
                                     wraps_selected_attributes, wraps_a_builtin, contextmanager_keeps_its_doc,
                                     missing_attribute_caught)}


@pytest.mark.parametrize("name", ONE_GRAPH)
def test_attributes_are_eagers(name):
    check(ONE_GRAPH[name], torch.randn(3))


@pytest.mark.allows_fallback("graph_break: print() breaks the graph on purpose")
def test_attributes_survive_a_graph_break():
    # the continuation guards the rebuilt functions by identity, and each call makes new ones: no second call
    check(rebuilt_after_a_break, torch.randn(3), second=False)


def made_and_wrapped():
    def inner(a: torch.Tensor):
        """Inner's doc."""
    inner.tag = "kept"

    @functools.wraps(inner)
    def outer():
        pass
    return outer, inner


def test_wrapped_attributes_are_the_same_objects_once_returned():
    # functools.wraps copies the objects themselves (CPython's test_functools checks them with assertIs)
    import kiln

    outer, inner = kiln.compile(made_and_wrapped, backend="eager")()
    for name in (*functools.WRAPPER_ASSIGNMENTS, "tag"):
        assert getattr(outer, name) is getattr(inner, name), name
    assert outer.__wrapped__ is inner
