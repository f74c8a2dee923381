"""A dict subclass's own `__getitem__`, `__setitem__` and `__delitem__` run under capture as in eager.

transformers' activation table (`ACT2FN`) is an OrderedDict whose `__getitem__` builds a module from a
stored (class, kwargs) pair; kiln used to answer `d[k]` with the stored item, so calling the result
constructed the class with the activation's input (a wrong exception). C-level dict methods (dict.update,
setdefault, pop) bypass the overrides, as in CPython; OrderedDict.update goes through `self[k] = v`.
"""
from __future__ import annotations

import collections
import collections.abc
from collections import OrderedDict

import torch
from torch import nn

import kiln
from support.capture import check


class Instantiating(OrderedDict):
    def __getitem__(self, key):
        content = super().__getitem__(key)
        cls, kwargs = content if isinstance(content, tuple) else (content, {})
        return cls(**kwargs)


class Scaled:
    def __init__(self, factor=1.0):
        self.factor = factor

    def __call__(self, x):
        return x * self.factor


TABLE = Instantiating({"plain": Scaled, "double": (Scaled, {"factor": 2.0})})
ACTIVATIONS = Instantiating({"silu": nn.SiLU, "gelu": (nn.GELU, {"approximate": "tanh"})})


class Doubling(dict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value * 2)

    def __delitem__(self, key):
        super().__setitem__("deleted", key)
        super().__delitem__(key)


class DoublingOrdered(OrderedDict):
    def __setitem__(self, key, value):
        super().__setitem__(key, value * 2)


def instantiate_and_call(x):
    return TABLE["plain"](x) + TABLE["double"](x)


def instantiate_torch_modules(x):
    return ACTIVATIONS["silu"](x) + ACTIVATIONS["gelu"](x)


def store_and_delete_through_overrides(x, d):
    d["a"] = x
    d["b"] = 3
    del d["b"]
    return d["a"] + len(d["deleted"])


def c_level_methods_bypass_overrides(x, d, o):
    d.update({"a": x})  # dict.update stores directly
    d.setdefault("b", x)
    o.update({"c": x})  # MutableMapping.update: through __setitem__
    return d["a"] + d["b"] + o["c"]


def _same_as_eager(fn, make_containers):
    """fn on fresh containers, eagerly and compiled (fullgraph): same result, same containers after."""
    x = torch.randn(3)
    eager_containers, compiled_containers = make_containers(), make_containers()
    expected = fn(x, *eager_containers)
    actual = kiln.compile(fn, backend="eager", fullgraph=True)(x, *compiled_containers)
    torch.testing.assert_close(actual, expected)
    for e, c in zip(eager_containers, compiled_containers):
        assert type(e) is type(c) and list(e) == list(c)
        for k in e:
            if isinstance(e[k], torch.Tensor):
                torch.testing.assert_close(c[k], e[k])
            else:
                assert c[k] == e[k], k


def test_getitem_override_builds_objects():
    check(instantiate_and_call, torch.randn(3), graphs=1, fullgraph=True)


def test_getitem_override_building_torch_modules():
    check(instantiate_torch_modules, torch.randn(3), graphs=1, fullgraph=True)


def test_setitem_and_delitem_overrides():
    _same_as_eager(store_and_delete_through_overrides, lambda: (Doubling(),))


def test_c_level_dict_methods_bypass_overrides():
    _same_as_eager(c_level_methods_bypass_overrides, lambda: (Doubling(), DoublingOrdered()))


def counter_semantics(x, c, d):
    # Counter's own == and != ignore zero counts; its repr names the class
    return x + 1, c == d, c != d, repr(c)


def test_dict_subclass_operators_and_repr_are_the_subclass_own():
    from collections import Counter

    x = torch.randn(2)
    c, d = Counter(a=3, b=2, c=0), Counter(a=3, b=2)
    expected = counter_semantics(x, c, d)
    actual = kiln.compile(counter_semantics, backend="eager")(x, c, d)
    torch.testing.assert_close(actual[0], expected[0])
    assert actual[1:] == expected[1:] == (True, False, "Counter({'a': 3, 'b': 2, 'c': 0})")


def counter_arithmetic(x, c, d):
    # Counter's own |, &, -, +, comparisons and unary signs (found by CPython's test_collections): dict's `|`
    # merge kept a zero count that Counter's `|` drops
    e = c.copy()
    e |= d
    f = c.copy()
    f -= d
    return (x * 2, c | d, c & d, c - d, c + d, c <= d, c >= d, c < d, c > d, +c, -d, e, f,
            set(c | d), sorted((c | d).elements()))


def test_counter_operators_are_counters_own():
    from collections import Counter

    for c, d in ((Counter(a=1, b=0), Counter(a=1)), (Counter(a=2, b=1), Counter(a=1, c=3)), (Counter(), Counter(z=1))):
        x = torch.randn(2)
        expected = counter_arithmetic(x, c, d)
        actual = kiln.compile(counter_arithmetic, backend="eager")(x, c.copy(), d.copy())
        torch.testing.assert_close(actual[0], expected[0])
        assert actual[1:] == expected[1:]
        assert [type(v) for v in actual[1:5]] == [Counter] * 4


class Lookup(collections.abc.Mapping):
    """A Mapping that is not a dict: dict(m) and d.update(m) read m.keys() and m[k], as CPython does."""

    def __init__(self, data):
        self.data = data

    def __getitem__(self, key):
        return self.data[key] * 10

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)


def dict_of_mappings(x, lookup):
    chained = collections.ChainMap({"a": 1}, {"b": 2, "a": 3})
    merged = dict(chained)
    merged.update(lookup)
    return x + len(merged), merged, dict(lookup)


def test_dict_of_a_mapping_reads_its_keys():
    check(dict_of_mappings, torch.randn(2), Lookup({"c": 1.0}), graphs=1)
