"""Python patterns that library model code (transformers, timm, ...) relies on, each captured in one graph.

Written from the gaps found compiling Hugging Face models whole: wraps'd decorators,
attribute hooks (`__getattribute__`, `__setattr__`, properties), dict subclasses,
the Sequence protocol, objects made in forward that escape, logging and warnings,
`inspect.signature`, typing-driven validators, `os.environ` switches, loss modules
built in forward.
"""
from __future__ import annotations

import collections.abc
import functools
import inspect
import logging
import os
import typing
import warnings

import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import check, recompile_reasons, t


def test_wraps_decorator_binds_by_the_wrapper_signature():
    def returns_twice(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            return out, out * 2

        return wrapper

    @returns_twice
    def f(x, y=None, scale=3):
        return x * scale + (y if y is not None else 0)

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = t(3)
    for a, b in zip(compiled(x, scale=2), f(x, scale=2)):
        torch.testing.assert_close(a, b)


class AliasConfig:
    """Like transformers' PretrainedConfig: attribute aliases through __getattribute__/__setattr__."""

    attribute_map = {"n_layers": "num_layers"}

    def __init__(self):
        self.num_layers = 3
        self.scale = 2.0

    def __getattribute__(self, key):
        if key != "attribute_map" and key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        return super().__getattribute__(key)

    def __setattr__(self, key, value):
        if key in super().__getattribute__("attribute_map"):
            key = super().__getattribute__("attribute_map")[key]
        super().__setattr__(key, value)


def test_getattribute_override_is_inlined_and_guarded():
    cfg = AliasConfig()

    def f(x):
        return x * cfg.n_layers + cfg.scale

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = t(4)
    torch.testing.assert_close(compiled(x), f(x))
    cfg.num_layers = 5  # read through the alias: the guard on the real attribute fires
    torch.testing.assert_close(compiled(x), f(x))
    assert len(context_of(compiled).records) == 2


def test_setattr_override_runs_and_is_replayed():
    cfg = AliasConfig()

    def f(x):
        cfg.n_layers = 7  # stored under num_layers by the class's __setattr__
        return x * cfg.num_layers

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = t(2)
    torch.testing.assert_close(compiled(x), x * 7)
    assert cfg.num_layers == 7 and "n_layers" not in vars(cfg)


class Scaled:
    def __init__(self, v):
        self._v = v

    @property
    def v(self):
        return self._v * 10

    @v.setter
    def v(self, value):
        self._v = value + 1


class Slotted:
    __slots__ = ("a",)


class Recording:
    def __init__(self):
        self.log = {}

    def __setattr__(self, k, v):
        object.__setattr__(self, k, v)
        if k != "log":
            self.log[k] = v


def test_objects_made_in_forward_respect_properties_slots_and_setattr():
    def f(x):
        s = Slotted()
        s.a = 3
        q = Scaled(1)
        q.v = 4  # the setter stores 5; the getter reads 50
        r = Recording()
        r.z = 7
        return x * s.a + q.v + r.log["z"], q, r

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = t(2)
    (out, q, r), (ref, q_ref, r_ref) = compiled(x), f(x)
    torch.testing.assert_close(out, ref)
    assert type(q) is Scaled and q.v == q_ref.v == 50 and vars(q) == vars(q_ref)
    assert type(r) is Recording and r.log == r_ref.log == {"z": 7}


def test_property_setter_on_an_existing_object():
    obj = Scaled(0)

    def f(x):
        obj.v = 5
        return x + obj.v

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = t(2)
    torch.testing.assert_close(compiled(x), x + 60)
    assert obj._v == 6


class Registry(dict):
    """Like transformers' _CanRecordRegistry: a dict subclass whose `get` is Python code."""

    def get(self, key):
        return super().get(str(key)) or {}


def test_dict_subclass_methods_are_inlined():
    reg = Registry({"a": {"hidden": 2}})

    def f(x):
        return x * len(reg.get("a")) + len(reg.get("missing"))

    check(f, t(3), fullgraph=True, graphs=1)


class Layers(collections.abc.Sequence):
    """A Sequence with only __len__ and __getitem__: iteration comes from collections.abc."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(i)
        return i * 2


def test_sequence_protocol_iteration():
    def f(x):
        total = x
        for k in Layers(3):
            total = total + k
        return total

    check(f, t(3), fullgraph=True, graphs=1)


def test_logging_and_warnings_are_replayed_after_the_graph(caplog):
    logger = logging.getLogger("kiln.tests.library_patterns")

    def f(x):
        logger.warning("scaling by %d", 3)
        warnings.warn("deprecated path")  # noqa: B028  (the call under test, as libraries write it)
        return x * 3

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = t(2)
    with caplog.at_level(logging.WARNING, logger="kiln.tests.library_patterns"), \
            pytest.warns(UserWarning, match="deprecated path"):
        torch.testing.assert_close(compiled(x), x * 3)
    assert "scaling by 3" in caplog.text
    assert len(context_of(compiled).records) == 1


class Chunked(torch.nn.Module):
    """Like transformers' apply_chunking_to_forward: the arity of a method decides the call."""

    def chunk(self, a, b):
        return a + b

    def forward(self, x):
        return x * len(inspect.signature(self.chunk).parameters)


def test_inspect_signature_of_a_method():
    from support.capture import check_module

    check_module(Chunked, t(3), fullgraph=True, graphs=1)


VALIDATORS = {typing.Union: "union", typing.Literal: "literal", list: "list"}


def test_typing_annotations_and_type_keyed_dicts():
    annotation = typing.Optional[typing.Literal["a", "b"]]  # noqa: UP045  (typing.Union is what the table keys)

    def f(x):
        kinds = [VALIDATORS.get(typing.get_origin(arg), "simple") for arg in typing.get_args(annotation)]
        return x * len(kinds) if kinds[0] == "literal" else x

    check(f, t(3), fullgraph=True, graphs=1)


def test_environment_switch_is_guarded(monkeypatch):
    monkeypatch.delenv("KILN_TEST_SWITCH", raising=False)

    def f(x):
        if os.environ.get("KILN_TEST_SWITCH", "0") == "1":
            return x + 1
        return x - 1

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = t(2)
    torch.testing.assert_close(compiled(x), x - 1)
    monkeypatch.setenv("KILN_TEST_SWITCH", "1")
    torch.testing.assert_close(compiled(x), x + 1)
    assert len(context_of(compiled).records) == 2
    assert "KILN_TEST_SWITCH" in recompile_reasons(context_of(compiled))[0]


def test_loss_module_built_in_forward():
    def f(logits, target):
        loss_fct = torch.nn.CrossEntropyLoss(ignore_index=-1)
        return loss_fct(logits, target)

    check(f, t(4, 5, grad=True), torch.tensor([0, 1, -1, 4]), fullgraph=True, graphs=1)


def test_module_with_parameters_built_in_forward_breaks():
    def f(x):
        return torch.nn.Linear(3, 3)(x)

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(Exception, match="parameters or buffers"):
        compiled(t(2, 3))


class Lookup(collections.abc.Mapping):
    """A Mapping whose `get` and `in` come from collections.abc: both rely on catching KeyError."""

    def __init__(self):
        self.d = {"a": 2}

    def __getitem__(self, k):
        return self.d[k]

    def __iter__(self):
        return iter(self.d)

    def __len__(self):
        return len(self.d)


LOOKUP = Lookup()


def test_exceptions_raised_and_caught_in_traced_code():
    def f(x):
        a = LOOKUP.get("a", 5) + LOOKUP.get("missing", 7)
        try:
            raise ValueError("bad")
        except (KeyError, ValueError) as e:
            a += len(e.args)
        try:
            [1, 2][5]
        except IndexError:
            a += 10
        return x * a, "a" in LOOKUP, "b" in LOOKUP

    check(f, t(3), fullgraph=True, graphs=1)


def test_uncaught_exception_still_raises():
    def f(x):
        try:
            return x * LOOKUP["missing"]
        except ValueError:
            return x

    compiled = kiln.compile(f, backend="eager")
    with pytest.raises(KeyError):
        compiled(t(2))


def test_tensor_type_conversion_is_an_op():
    def f(x):
        return x.softmax(-1).type(torch.float64) * 2

    check(f, t(2, 3), fullgraph=True, graphs=1)


def test_attribute_error_caught_by_traced_code():
    cfg = AliasConfig()

    def f(x):
        try:
            extra = cfg.not_there
        except AttributeError:
            extra = 1
        return x * (cfg.num_layers + extra)

    check(f, t(3), fullgraph=True, graphs=1)


def test_hasattr_and_attribute_errors_are_guarded():
    class Holder:
        pass

    h = Holder()

    def f(x):
        try:
            extra = h.extra
        except AttributeError:
            extra = 1
        return x * (extra + (10 if hasattr(h, "flag") else 0))

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = t(2)
    torch.testing.assert_close(compiled(x), x)
    h.extra = 3
    torch.testing.assert_close(compiled(x), x * 3)
    h.flag = True
    torch.testing.assert_close(compiled(x), x * 13)
    assert len(context_of(compiled).records) == 3


def test_forward_hooks_are_inlined_and_guarded():
    """Hooks left on submodules (transformers installs output-capturing hooks once) stay in one graph."""
    seen = []

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.inner(x).relu()

    net = Net()
    net.inner.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    net.inner.register_forward_hook(lambda m, args, out: out + 1)
    net.inner.register_forward_hook(lambda m, args, out: seen.append(out.shape))  # returns None: output kept
    compiled = kiln.compile(net, backend="eager", fullgraph=True)
    x = t(2, 3)
    torch.testing.assert_close(compiled(x), net(x))
    assert seen == [torch.Size([2, 3])] * 2  # the list append is replayed after the graph
    handle = net.inner.register_forward_hook(lambda m, args, out: out * 0)
    torch.testing.assert_close(compiled(x), net(x))  # a new hook recompiles
    handle.remove()
    assert len(context_of(compiled).records) == 2


ACT = functools.partial(torch.nn.functional.gelu, approximate="tanh")


def test_existing_functools_partial_is_called_through():
    class Act(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act = ACT

        def forward(self, x):
            return self.act(x) * 2

    from support.capture import check_module

    check_module(Act, t(2, 3), fullgraph=True, graphs=1)


def test_augmented_assignment_of_a_tensor_onto_a_number():
    """T5's `position_bias = 0; position_bias += mask`-style code: the graph gets `0 + t`, not `0 += t`."""

    def f(x):
        total = 0
        for i in range(3):
            total += x * i
        items = [1]
        items += [2]
        return total, len(items)

    check(f, t(3), fullgraph=True, graphs=1)


def test_exception_through_a_with_block_is_not_caught_in_the_graph():
    """Catching it outside would skip the `with`'s __exit__ in the trace: it must not be handled there."""

    def inner(x):
        with torch.no_grad():
            y = x * 2
            raise KeyError("k")
        return y

    def f(x):
        try:
            return inner(x)
        except KeyError:
            return x * 3 + torch.is_grad_enabled()

    compiled = kiln.compile(f, backend="eager")
    x = t(2)
    torch.testing.assert_close(compiled(x), f(x))
    assert torch.is_grad_enabled()


class Faulty:
    @property
    def broken(self):
        return {}["missing"]  # a KeyError: getattr's default must not hide it


FAULTY = Faulty()


def test_getattr_default_swallows_only_attribute_error():
    def f(x):
        return x * getattr(FAULTY, "absent", 2)

    check(f, t(2), fullgraph=True, graphs=1)

    def g(x):
        return x * getattr(FAULTY, "broken", 2)

    compiled = kiln.compile(g, backend="eager")
    with pytest.raises(KeyError):
        compiled(t(2))


def _validate_union(name, value, expected):
    if not isinstance(value, typing.get_args(expected)):
        raise TypeError(f"{name} must be {expected}")


_VALIDATORS = {typing.Union: _validate_union}


def _validate(name, value, expected):
    if (origin := typing.get_origin(expected)) is None:
        return
    elif validator := _VALIDATORS.get(origin):  # a function tested for truth (huggingface_hub's strict dataclasses)
        validator(name, value, expected)


def test_function_looked_up_in_a_table_and_tested_for_truth():
    def fn(x):
        _validate("problem_type", "single_label", typing.Optional[str])  # noqa: UP045  (the typing form under test)
        return x * 2

    check(fn, t(3), fullgraph=True, graphs=1)
