"""Attributes found on a class: what `Cls.name` and `obj.name` (resolved through the MRO) read, and their guards.

A class is a mutable object like any other: `Cls.scale = 3.0` or `Cls.forward = patched` after compiling must
recompile, not run the old value. So every attribute capture reads off a Python class is guarded where it was
found: a method by the identity of its function, data by its value (through `wrap`), an attribute that is
missing by its absence. The guard reads the class through the MRO, as Python does, so a base class's change
and a subclass that starts shadowing it are both seen. Classes that cannot change (C types: `dict`,
`OrderedDict`, `torch.Size`) need no guard. Writes to a class made during capture are in the side-effect
overlay, and every read here sees them first.
"""
from __future__ import annotations

import types
from typing import Any

from kiln.capture.breaks import GraphBreak
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.side_effects import is_deleted
from kiln.capture.sources import AttrSource, ItemSource, Source
from kiln.capture.values.base import Value
from kiln.capture.values.exceptions import raise_python
from kiln.capture.values.functions import FunctionValue, MethodValue

_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: setting an attribute raises TypeError


def function_value(state, fn: types.FunctionType, source=None) -> FunctionValue:
    return FunctionValue.of(state, fn, source or state.constant_source(fn, fn.__name__))


def is_mutable_class(cls: type) -> bool:
    return not (cls.__flags__ & _IMMUTABLE_TYPE)


def class_source(state, cls: type, source: Source | None = None) -> Source:
    """Where guards read `cls`: its own source, or the class kept in the guard namespace (an instance's
    type guard, or the identity of the object it was reached from, pins which class that is)."""
    return source if source is not None else state.constant_source(cls, cls.__name__)


def mro_entry(cls: type, name: str) -> Any:
    """What `cls.name` finds in the MRO, before any descriptor runs (`_MISSING` when nothing)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return _MISSING


_MISSING = object()


def pending_class_attr(state, cls: type, name: str) -> Value | None:
    """A value traced code stored on `cls` or a base earlier in this capture, if the lookup reaches it."""
    for klass in cls.__mro__:
        pending = state.side_effects.pending_attr(klass, name)
        if pending is not None and is_deleted(pending):
            raise GraphBreak("unsupported_object", f"{klass.__name__}.{name} read after `del` in the compiled region")
        if pending is not None:
            return pending
        if name in klass.__dict__:
            return None
    return None


def guard_class_entry(state, cls: type, name: str, entry: Any, source: Source | None = None) -> None:
    """Guard that `cls.name` still finds `entry` (a function, property, static or class method, descriptor)."""
    if not is_mutable_class(cls):
        return

    attr = AttrSource(class_source(state, cls, source), name)
    if isinstance(entry, classmethod):  # each read binds anew: compare the function underneath
        attr, entry = AttrSource(attr, "__func__"), entry.__func__
    elif isinstance(entry, staticmethod):
        entry = entry.__func__
    elif not isinstance(entry, (types.FunctionType, property)) and hasattr(type(entry), "__get__"):
        _guard_raw_entry(state, cls, name, entry, source)  # a descriptor's __get__ may make a new object per read
        return
    state.guard_identity(entry, attr)


def _guard_raw_entry(state, cls: type, name: str, entry: Any, source: Source | None) -> None:
    expr = state.source_expr(class_source(state, cls, source))
    state.guards.namespace["___mro_entry"] = mro_entry
    name_in_namespace = state.guards.constant(entry, "obj")
    check = f"___mro_entry({expr}, {name!r}) is {name_in_namespace}"
    state.guards.add(Guard(GuardKind.ID_MATCH, None, check, f"{expr}.{name} is the same {type(entry).__name__}",
                           f"repr(___mro_entry({expr}, {name!r}))"))


def guard_class_lacks(state, cls: type, name: str, source: Source | None = None) -> None:
    """Capture relied on `cls` (and its bases) having no attribute `name`."""
    if is_mutable_class(cls):
        state.guard_hasattr(class_source(state, cls, source), name, False)


def class_data(state, cls: type, name: str, source: Source | None = None) -> Value:
    """`cls.name` for a plain value (a number, a list, a tensor, a nested class): wrapped, so guarded by value."""
    if not is_mutable_class(cls):
        return state.wrap_unsourced(getattr(cls, name))
    return state.wrap(getattr(cls, name), AttrSource(class_source(state, cls, source), name))


_OBJECT_CLASS = object.__dict__["__class__"]


def class_attribute(state, self_value: Value, cls: type, name: str, source) -> Value:
    """`obj.name` resolved on the class: methods bind, properties run, constants read.

    `source` is the attribute read through the instance (`L['obj'].name`), when the instance has one.
    """
    pending = pending_class_attr(state, cls, name)
    if pending is not None:
        pending = pending.realize()
        return MethodValue(self_value, pending) if isinstance(pending, FunctionValue) else pending
    attr = mro_entry(cls, name)
    if attr is _OBJECT_CLASS:  # `obj.__class__`: the type, as `type(obj)` (dataclasses' generated __eq__ asks)
        return state.wrap_unsourced(cls)
    if attr is _MISSING:
        guard_class_lacks(state, cls, name)
        raise raise_python(AttributeError, f"{cls.__name__!r} object has no attribute {name!r}")
    if isinstance(attr, (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType)):
        raise GraphBreak("unsupported_call", f"{cls.__name__}.{name} is a C method")
    if isinstance(attr, types.FunctionType):
        guard_class_entry(state, cls, name, attr)
        return MethodValue(self_value, function_value(state, attr))
    if isinstance(attr, property) and isinstance(attr.fget, types.FunctionType):
        guard_class_entry(state, cls, name, attr)
        return function_value(state, attr.fget).call(state, [self_value], {})
    if isinstance(attr, staticmethod):
        guard_class_entry(state, cls, name, attr)
        return state.wrap_unsourced(attr.__func__)
    if isinstance(attr, classmethod):
        guard_class_entry(state, cls, name, attr)
        return MethodValue(state.wrap_unsourced(cls), function_value(state, attr.__func__))  # a ClassValue
    descriptor_get = getattr(type(attr), "__get__", None)
    if isinstance(descriptor_get, types.FunctionType) and _new_object_per_read(self_value, name):
        # a descriptor written in Python that makes a new object per read (functools.partialmethod): an identity
        # guard on the object read would never hold again, so its __get__ is traced instead
        guard_class_entry(state, cls, name, attr)
        owner = next(k for k in cls.__mro__ if name in k.__dict__)
        descriptor = state.wrap(attr, ItemSource(AttrSource(class_source(state, owner), "__dict__"), name))
        owner_class = state.wrap_unsourced(cls)
        return function_value(state, descriptor_get).call(state, [descriptor, self_value, owner_class], {})
    if source is not None:  # guarded by value through the instance: a change on the class is seen too
        return state.wrap(getattr(self_value.obj, name), source)
    if hasattr(type(attr), "__get__"):  # a descriptor kiln does not run (cached_property, a C getset)
        raise GraphBreak("unsupported_object", f"{cls.__name__}.{name} (a {type(attr).__name__})")
    return class_data(state, cls, name)


def _new_object_per_read(self_value: Value, name: str) -> bool:
    """Whether reading `obj.name` twice gives two objects (only asked of descriptors written in Python; one that
    caches, as functools.cached_property does, gives the cached object the second time)."""
    obj = getattr(self_value, "obj", None)
    if obj is None:
        return True
    try:
        return getattr(obj, name) is not getattr(obj, name)
    except Exception:
        return True


def guard_not_shadowed(state, self_value: Value, name: str) -> None:
    """`obj.name` resolved on the class: guard that the instance does not gain its own `name` later
    (`m.act = torch.sigmoid` after compiling a forward that called the method `self.act`)."""
    source = getattr(self_value, "source", None)
    if source is None or not hasattr(getattr(self_value, "obj", None), "__dict__"):
        return
    expr = state.source_expr(source)
    state.guards.add(Guard(GuardKind.NOT_SHADOWED, source, f"{name!r} not in {expr}.__dict__",
                           f"{name!r} read from the class", f"{expr}.__dict__.get({name!r})"))
