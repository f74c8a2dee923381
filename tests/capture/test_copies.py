"""copy.deepcopy and copy.copy inside a compiled function (kiln/capture/values/copies.py).

transformers deep-copies a model's config inside forwards (T5, BART, Whisper build a cache from a copy), so
the copy must stay in the graph. Each case compares with eager (the copy a new object, independent of the
original where eager's is, sharing where eager's shares) and kiln's graph count with torch.compile's.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

import kiln
from kiln.api import context_of
from support.capture import CountingBackend, graph_count


class Settings:
    def __init__(self, scale, names, table, inner=None):
        self.scale, self.names, self.table, self.inner = scale, names, table, inner


class Aliased:
    """Aliases answered by __getattribute__, like a transformers config's attribute_map."""

    aliases = {"width": "hidden"}

    def __init__(self, hidden):
        self.hidden = hidden

    def __getattribute__(self, name):
        if name != "aliases" and name in type(self).aliases:
            name = type(self).aliases[name]
        return super().__getattribute__(name)


class OwnCopy:
    def __init__(self, n):
        self.n = n

    def __deepcopy__(self, memo):
        return OwnCopy(self.n + 100)


def _settings():
    shared = [1, 2]
    return Settings(2.0, shared, {"a": shared, "b": (3, 4)}, Settings(0.5, [], {}))


def deep_settings(x, s):
    c = copy.deepcopy(s)
    c.names.append(3)  # the copy's list (shared with c.table["a"], as in the original), not the original's
    c.scale = c.scale * 3
    return x * c.scale + len(c.table["a"]) + c.inner.scale, c


def shallow_settings(x, s):
    c = copy.copy(s)
    c.scale = 10.0  # the copy's own attribute
    return x * c.scale + len(c.names), c


def deep_containers(x, items):
    c = copy.deepcopy(items)
    c["list"].append(9)
    return x + sum(c["list"]) + c["tuple"][0], c


def deep_aliased(x, a):
    c = copy.deepcopy(a)
    c.hidden = c.width * 2
    return x * c.width, c


def deep_own_protocol(x, o):
    return x + copy.deepcopy(o).n  # __deepcopy__ is the class's own: kiln does not model it (a break)


CASES = {
    "deep_settings": (deep_settings, _settings),
    "shallow_settings": (shallow_settings, _settings),
    "deep_containers": (deep_containers, lambda: {"list": [1, 2], "tuple": (5, [6])}),
    "deep_aliased": (deep_aliased, lambda: Aliased(3)),
    "deep_own_protocol": (deep_own_protocol, lambda: OwnCopy(1)),
}


def _state(obj):
    """What an object holds, nested objects included, comparable across runs (identities aside)."""
    if isinstance(obj, (list, tuple)):
        return type(obj)(_state(v) for v in obj)
    if isinstance(obj, dict):
        return {k: _state(v) for k, v in obj.items()}
    if hasattr(obj, "__dict__"):
        return (type(obj), _state(vars(obj)))
    return obj


@pytest.mark.parametrize("name", list(CASES))
def test_copy_matches_eager_in_no_more_graphs_than_torch(name):
    fn, make = CASES[name]
    x = torch.randn(3)
    original = make()
    expected, expected_copy = fn(x, original) if name != "deep_own_protocol" else (fn(x, original), None)
    counts = {}
    for label, compile_ in (("kiln", kiln.compile), ("torch", torch.compile)):
        torch._dynamo.reset()
        backend = CountingBackend()
        obj = make()
        out = compile_(fn, backend=backend)(x, obj)
        actual, actual_copy = out if expected_copy is not None else (out, None)
        torch.testing.assert_close(actual, expected)
        if expected_copy is not None:
            assert actual_copy is not obj
            assert _state(actual_copy) == _state(expected_copy)
            assert _state(obj) == _state(original)
            if name == "deep_settings":  # the copy shares its list between two places, as the original does
                assert actual_copy.names is actual_copy.table["a"] and actual_copy.names is not obj.names
        counts[label] = backend.graphs
    assert counts["kiln"] <= counts["torch"], counts


def test_deepcopy_of_a_config_stays_in_one_graph_and_recompiles_on_change():
    compiled = kiln.compile(deep_settings, backend="eager", fullgraph=True)
    x = torch.randn(3)
    s = _settings()
    out, first = compiled(x, s)
    out2, second = compiled(x, s)
    assert first is not second and first.names is not second.names  # a new copy per call
    assert s.names == [1, 2]
    s.scale = 4.0
    torch.testing.assert_close(compiled(x, s)[0], deep_settings(x, _settings_with(4.0))[0])
    assert graph_count(context_of(compiled)) == 2


def _settings_with(scale):
    s = _settings()
    s.scale = scale
    return s


def test_deepcopy_of_a_tensor_breaks_and_stays_correct():
    def fn(x, holder):
        c = copy.deepcopy(holder)
        return x + c["t"]

    t = torch.randn(3)
    out = kiln.compile(fn, backend="eager")(torch.ones(3), {"t": t})
    torch.testing.assert_close(out, torch.ones(3) + t)


def test_a_copy_of_a_copy():
    def fn(x, s):
        first = copy.deepcopy(s)
        first.scale = 5.0
        second = copy.deepcopy(first)
        second.names.append(7)
        return x * second.scale, first, second

    s = _settings()
    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    out, first, second = compiled(torch.ones(2), s)
    torch.testing.assert_close(out, torch.full((2,), 5.0))
    assert first.names == [1, 2] and second.names == [1, 2, 7] and s.scale == 2.0 and second.scale == 5.0
