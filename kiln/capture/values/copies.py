"""`copy.deepcopy` and `copy.copy` of Python state during capture.

Library code copies plain objects inside forwards: transformers deep-copies a model's config when it builds a
cache (T5, BART, Whisper). Inlining `copy.py` reaches `object.__reduce_ex__`, a C method, so kiln models the
copy itself, as the default protocol does it for the objects it accepts: containers are rebuilt item by item,
immutable constants are shared, and an instance of a class that keeps the default reduction (no `__deepcopy__`,
`__reduce_ex__`, `__reduce__`, `__getstate__`, `__setstate__` or `__new__` of its own) becomes a new object
with copies of its instance attributes, read through their sources (so guarded: a changed attribute
recompiles). A copy shares structure as the original does (the memo), and is a new object at every call.
Anything else (tensors, objects with their own copy protocol) is a graph break, as before.
"""
from __future__ import annotations

import copy
import types

import torch

from kiln.capture.breaks import GraphBreak
from kiln.capture.values.base import Value
from kiln.capture.values.containers import ListValue, TupleValue
from kiln.capture.values.dicts import DictValue
from kiln.capture.values.objects import NewObjectValue, ObjectValue

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range, types.FunctionType, type,
              torch.dtype, torch.device, torch.layout, torch.memory_format)
_COPY_PROTOCOL = ("__deepcopy__", "__copy__", "__reduce_ex__", "__reduce__", "__getstate__", "__setstate__",
                  "__new__", "__slots__")
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python


def _deepcopy(state, value: Value, memo: Value | None = None) -> Value:
    if memo is not None and not (memo.is_constant() and memo.as_constant() is None):
        raise GraphBreak("unsupported_call", "copy.deepcopy with a memo dict")
    return deep_copy(state, value, {})


def _copy(state, value: Value) -> Value:
    value = value.realize()
    if _immutable(value):
        return value
    if isinstance(value, ListValue):
        return ListValue(list(value.items))
    if isinstance(value, DictValue) and value.cls is dict:
        return DictValue(dict(value.items))
    return _copy_instance(state, value, lambda item: item)


def deep_copy(state, value: Value, memo: dict[int, Value]) -> Value:
    value = value.realize()
    if _immutable(value):
        return value
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, ListValue):
        copied = memo[id(value)] = ListValue([])
        copied.items.extend(deep_copy(state, item, memo) for item in value.items)
        return copied
    if isinstance(value, TupleValue) and value.cls is tuple:
        return TupleValue([deep_copy(state, item, memo) for item in value.items])
    if isinstance(value, DictValue) and value.cls is dict and value.default_factory is None:
        copied = memo[id(value)] = DictValue({})
        for key, item in value.pairs(state):
            copied.items[key] = deep_copy(state, item, memo)
        return copied
    return _copy_instance(state, value, lambda item: deep_copy(state, item, memo), memo)


def _immutable(value: Value) -> bool:
    if not value.is_constant():
        return False
    constant = value.as_constant()
    if isinstance(constant, tuple):
        return all(isinstance(c, _IMMUTABLE) for c in constant)
    return isinstance(constant, _IMMUTABLE)


def _copy_instance(state, value: Value, copy_item, memo: dict[int, Value] | None = None) -> Value:
    """A new instance of an existing object's class holding copies of its instance attributes."""
    cls = value.python_type()
    if not isinstance(value, (ObjectValue, NewObjectValue)) or not _default_protocol(cls):
        raise GraphBreak("unsupported_call", f"copying a {cls.__name__} (kiln copies plain objects and containers)")
    attrs = value.generic_getattr(state, "__dict__").realize()  # an existing object's: read through its source
    if not isinstance(attrs, DictValue):
        raise GraphBreak("unsupported_call", f"copying a {cls.__name__} whose __dict__ kiln does not see")
    copied = NewObjectValue(cls)
    if memo is not None:
        memo[id(value)] = copied
    for name, item in attrs.pairs(state):
        copied.attrs[name] = copy_item(item)
    return copied


def _default_protocol(cls: type) -> bool:
    """Whether copying `cls` instances is `object`'s protocol: a new instance, the instance dict copied. Every
    class of the MRO but `object` is a Python class (no C base with a layout of its own) that defines none of
    the copy protocol's methods (nor `__slots__`)."""
    return all(klass.__flags__ & _HEAP_TYPE and not any(name in klass.__dict__ for name in _COPY_PROTOCOL)
               for klass in cls.__mro__[:-1])


# registered in values/builtins.py's HANDLERS
HANDLERS = {copy.deepcopy: _deepcopy, copy.copy: _copy}
