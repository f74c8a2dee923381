"""Everything else: classes, Python modules, user objects, partials, super(), and opaque values.

User objects are read attribute by attribute through their source (each read
guarded by what it found); their Python methods and properties are inlined.
Objects made during capture (a dataclass, a namedtuple, a small helper class)
are fully symbolic and rebuilt by the output program if they escape.
An opaque value is a runtime object kiln does not model (a numpy array, an
unknown C object): every operation on it is a graph break.
"""
from __future__ import annotations

import collections
import collections.abc
import dataclasses
import enum
import functools
import types
from typing import Any

import torch

from kiln.capture.breaks import GraphBreak
from kiln.capture.side_effects import is_deleted
from kiln.capture.sources import AttrSource, ConstantSource
from kiln.capture.values.autograd_function import FunctionApplyValue, is_function_apply
from kiln.capture.values.backend_switches import is_switch_call
from kiln.capture.values.base import Value
from kiln.capture.values.classes import (
    class_attribute,
    class_data,
    function_value,
    guard_class_entry,
    guard_class_lacks,
    guard_not_shadowed,
    is_mutable_class,
    pending_class_attr,
)
from kiln.capture.values.constant import TORCH_DESCRIPTORS, ConstantValue, is_literal
from kiln.capture.values.containers import IteratorValue, ListValue, SetValue, TupleValue, python_override
from kiln.capture.values.dicts import DictValue
from kiln.capture.values.exceptions import ExceptionValue, TracedException, is_exception_class, raise_python
from kiln.capture.values.functions import BoundMethodValue, BuiltinValue, MethodValue
from kiln.capture.values.iterators import LazyIteratorValue
from kiln.capture.values.modules import ModuleValue
from kiln.capture.values.symbolic import SymValue
from kiln.capture.values.torch_api import inlined_torch_function, wrap_torch_attr


def object_value(obj: Any, state=None) -> Value:
    """A tracker for an object reached without a source (a class attribute, a closure default)."""
    if isinstance(obj, types.FunctionType) and (obj.__module__ or "").startswith("numpy"):
        return BuiltinValue(obj)  # numpy's Python functions are not traced: calling one is a numpy break
    if isinstance(obj, types.FunctionType) and state is not None:
        return function_value(state, obj)
    if isinstance(obj, type):
        return ClassValue(obj)
    if isinstance(obj, types.ModuleType):
        return PythonModuleValue(obj)
    if type(obj) in (list, tuple) and obj and all(isinstance(x, type) for x in obj):
        # a table of classes (torch's `_foreach_supported_types`): read for membership, not mutated
        items = [ClassValue(x) for x in obj]
        return ListValue(items) if isinstance(obj, list) else TupleValue(items)
    if (getattr(obj, "__module__", "") or "").startswith("torch") and callable(obj):
        return wrap_torch_attr(obj)
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return BuiltinValue(obj)
    if is_literal(obj) or isinstance(obj, (*TORCH_DESCRIPTORS, torch.Size, enum.Enum)):
        return ConstantValue(obj)  # immutable: enum members too (`mode is Mode.A` must fold right)
    return OpaqueValue(obj)


class ClassValue(Value):
    def __init__(self, cls: type, source=None):
        self.cls, self.obj, self.source = cls, cls, source

    def python_type(self) -> type:
        return type(self.cls)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.cls

    def getattr(self, state, name: str) -> Value:
        """`Cls.name`, guarded where the MRO found it (see `classes`); a value stored earlier in this capture wins."""
        pending = pending_class_attr(state, self.cls, name)
        if pending is not None:
            return pending
        for klass in self.cls.__mro__:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if klass in _BUILTIN_BASES and isinstance(attr, (types.WrapperDescriptorType,
                                                                 types.MethodDescriptorType)):
                    return UnboundSlotValue(klass, name)
                if isinstance(attr, classmethod):
                    guard_class_entry(state, self.cls, name, attr, self.source)
                    if is_function_apply(self.cls, attr):
                        return FunctionApplyValue(self.cls, self)
                    return MethodValue(self, function_value(state, attr.__func__))
                if isinstance(attr, (staticmethod, types.FunctionType, property)) or (
                        hasattr(type(attr), "__get__") and not isinstance(attr, type)):
                    guard_class_entry(state, self.cls, name, attr, self.source)
                    return object_value(getattr(self.cls, name), state)
                return class_data(state, self.cls, name, self.source)
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantValue(getattr(self.cls, name))
        guard_class_lacks(state, self.cls, name, self.source)
        raise raise_python(AttributeError, f"type object {self.cls.__name__!r} has no attribute {name!r}")

    def setattr(self, state, name: str, value: Value) -> None:
        """`Cls.count += 1`: replayed after the graph, in program order; later reads in this capture see it."""
        if not is_mutable_class(self.cls):
            raise raise_python(TypeError, f"cannot set {name!r} attribute of immutable type {self.cls.__name__!r}")
        state.side_effects.store_attr(self.cls, self, name, value)

    def delattr(self, state, name: str) -> None:
        if not is_mutable_class(self.cls) or name not in self.cls.__dict__:
            raise GraphBreak("unsupported_object", f"del {self.cls.__name__}.{name}")
        state.side_effects.del_attr(self.cls, self, name)

    def call(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        cls = self.cls
        if issubclass(cls, tuple) and hasattr(cls, "_fields"):
            return _namedtuple(cls, args, kwargs)
        if issubclass(cls, torch.nn.Module):
            return stateless_module(state, cls, args, kwargs)

        if is_exception_class(cls) and not kwargs:
            return ExceptionValue(cls, args)
        if dataclasses.is_dataclass(cls) and issubclass(cls, dict):
            return RecordedObjectValue(cls, args, kwargs)  # e.g. transformers' ModelOutput
        init = getattr(cls, "__init__", None)
        if cls.__new__ is object.__new__ and isinstance(init, types.FunctionType):
            obj = NewObjectValue(cls)
            function_value(state, init).call(state, [obj, *args], kwargs)
            return obj
        if cls.__new__ is object.__new__ and init is object.__init__ and not args and not kwargs:
            return NewObjectValue(cls)

        if state.models(cls):
            return state.call_builtin(cls, args, kwargs)
        if cls is torch.device and all(a.is_constant() for a in [*args, *kwargs.values()]):
            # an immutable value (FX prints a graph's device arguments as `device(type='cpu')`)
            constant_kwargs = {k: v.as_constant() for k, v in kwargs.items()}
            return ConstantValue(cls(*[a.as_constant() for a in args], **constant_kwargs))
        raise GraphBreak("unsupported_call", f"constructing {cls.__qualname__}")

    def reconstruct(self, writer) -> str:
        return writer.constant(self.cls)

    def __repr__(self) -> str:
        return f"Class({self.cls.__qualname__})"


# Libraries whose parameterless modules may be built once at capture time: their constructors only configure
# the new module (no effects elsewhere that would run once per compile instead of once per call).
# transformers' activation table (`ACT2FN[name]`) constructs one in many forwards.
STATELESS_MODULE_LIBRARIES = ("torch.nn.", "transformers.activations")


def stateless_module(state, cls: type, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """`CrossEntropyLoss()` in a forward: a torch.nn module without parameters or buffers.

    Built once, at capture time, from constant arguments (with the RNG state restored,
    so construction consumes no randomness); the graph calls its forward, which reads
    only the constant configuration the arguments set. It cannot escape the graph: a
    shared instance would be observable where eager made a new one per call.
    """
    if not cls.__module__.startswith(STATELESS_MODULE_LIBRARIES):
        raise GraphBreak("unsupported_call", f"constructing the module {cls.__name__} inside the compiled region")
    rng = torch.get_rng_state()
    try:
        module = cls(*(a.as_constant() for a in args), **{k: v.as_constant() for k, v in kwargs.items()})
    except GraphBreak:
        raise
    except Exception as e:
        raise GraphBreak("exception", f"{cls.__name__}(...) raised {type(e).__name__}: {e}") from e
    finally:
        torch.set_rng_state(rng)
    if any(True for _ in module.parameters()) or any(True for _ in module.buffers()):
        raise GraphBreak("unsupported_call", f"constructing the module {cls.__name__} (it has parameters or buffers)")
    return FreshModuleValue(module, state.constant_source(module, cls.__name__))


class FreshModuleValue(ModuleValue):
    """A module built during capture (see `stateless_module`): usable inside the graph only."""

    def reconstruct(self, writer) -> str:
        raise GraphBreak("unsupported_object",
                         f"the {type(self.module).__name__} built in the compiled region escapes it")


_BUILTIN_BASES = (object, dict, list, tuple, set)


class UnboundSlotValue(Value):
    """`object.__setattr__`, `dict.get`, ... called with the instance first: the instance's tracker answers."""

    def __init__(self, klass: type, name: str):
        self.klass, self.name = klass, name

    def call(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        target = args[0].realize() if args else None
        modelled = ((ObjectValue, NewObjectValue) if self.klass is object
                    else (DictValue, ListValue, TupleValue, SetValue))
        if not isinstance(target, modelled) or not issubclass(target.python_type(), self.klass):
            raise GraphBreak("unsupported_call", f"{self.klass.__name__}.{self.name} on {target}")
        return target.call_method(state, self.name, list(args[1:]), kwargs)

    def reconstruct(self, writer) -> str:
        return f"{writer.constant(self.klass)}.{self.name}"

    def __repr__(self) -> str:
        return f"UnboundSlot({self.klass.__name__}.{self.name})"


def _namedtuple(cls: type, args: list[Value], kwargs: dict[str, Value]) -> TupleValue:
    values = dict(zip(cls._fields, args))
    values.update(kwargs)
    for name, default in getattr(cls, "_field_defaults", {}).items():
        values.setdefault(name, ConstantValue(default))
    missing = [f for f in cls._fields if f not in values]
    if missing:
        raise GraphBreak("exception", f"{cls.__name__}() missing {missing}")
    return TupleValue([values[f] for f in cls._fields], cls=cls)


class PythonModuleValue(Value):
    def __init__(self, module: types.ModuleType):
        self.module, self.obj = module, module

    def python_type(self) -> type:
        return types.ModuleType

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.module

    def getattr(self, state, name: str) -> Value:
        pending = state.pending_globals.get((id(vars(self.module)), name))  # `mod.x = ...` or `global x` earlier
        if pending is not None:
            return pending
        descriptor = _module_descriptor(self.module, name)
        if descriptor is not None:  # torch.backends.cudnn.enabled: its getter is traced (a guarded switch)
            return self._descriptor_method(state, descriptor, "__get__", [ClassValue(type(self.module))])
        modname = self.module.__name__
        fixed = (modname in ("math", "operator", "cmath") or modname.startswith(("numpy", "torch."))
                 or modname == "torch")
        try:
            attr = getattr(self.module, name)
        except AttributeError as e:
            if not fixed:  # `getattr(mod, "flag", False)` relied on its absence
                state.guard_hasattr(self._source(state), name, False)
            raise raise_python(AttributeError, f"module {self.module.__name__!r} has no attribute {name!r}") from e
        if (modname == "torch" or modname.startswith("torch.")) and not inlined_torch_function(attr):
            return wrap_torch_attr(attr)
        if fixed:
            return object_value(attr, state)
        return state.wrap(attr, AttrSource(self._source(state), name))

    def _source(self, state):
        return state.constant_source(self.module, self.module.__name__.replace(".", "_"))

    def _descriptor_method(self, state, descriptor: Any, method: str, rest: list[Value]) -> Value:
        """`type(descriptor).<method>(descriptor, module, *rest)`, inlined."""
        source = state.constant_source(descriptor, f"{self.module.__name__}_{method}")
        tracker = state.wrap(descriptor, source)
        return function_value(state, getattr(type(descriptor), method)).call(state, [tracker, self, *rest], {})

    def setattr(self, state, name: str, value: Value) -> None:
        """`mod.flag = v`: a store into the module's globals, as `global flag; flag = v` in it would be; or, where
        the module's class defines `flag` as a data descriptor (`torch.backends.cudnn.enabled = False`), its
        `__set__` traced."""
        descriptor = _module_descriptor(self.module, name)
        if descriptor is not None:
            self._descriptor_method(state, descriptor, "__set__", [value])
            return
        if self.module.__name__.split(".")[0] in ("torch", "math", "operator", "numpy"):
            raise GraphBreak("unsupported_object", f"setting {self.module.__name__}.{name}")
        store_global(state, vars(self.module), name, value)

    def reconstruct(self, writer) -> str:
        return writer.constant(self.module)

    def __repr__(self):
        return f"PyModule({self.module.__name__})"


def _module_descriptor(module: types.ModuleType, name: str) -> Any:
    """The data descriptor a module object's own class (a `types.ModuleType` subclass, as torch.backends' are)
    defines for `name`, where its `__get__` and `__set__` are Python functions; else None. Of torch's, only
    those whose getter is a switch kiln models or Python code (torch.backends' ContextProp): the others
    (`torch.backends.miopen.immediate`) would only add their C getter to the graph, and read as constants."""
    for klass in type(module).__mro__:
        if klass is types.ModuleType:
            return None
        attr = klass.__dict__.get(name)
        if attr is not None:
            kind = type(attr)
            python = all(isinstance(getattr(kind, m, None), types.FunctionType) for m in ("__get__", "__set__"))
            return attr if python and (not module.__name__.startswith("torch") or _reads_a_switch(attr)) else None
    return None


def _reads_a_switch(descriptor: Any) -> bool:
    getter = getattr(descriptor, "getter", None)
    return isinstance(getter, types.FunctionType) or is_switch_call(getter)


def store_global(state, globals_: dict, name: str, value: Value) -> None:
    """A module global written by traced code: replayed after the graph, seen by later reads in this capture."""
    source = ConstantSource("G") if globals_ is state.G else state.global_source(globals_, name).base
    state.side_effects.store_item(DictValue({}, source=source), ConstantValue(name), value)
    state.pending_globals[(id(globals_), name)] = value


class ObjectValue(Value):
    """An existing user object, read through its source."""

    def __init__(self, obj: Any, source):
        self.obj, self.source = obj, source

    def python_type(self) -> type:
        return type(self.obj)

    def getattr(self, state, name: str) -> Value:
        hook = python_override(type(self.obj), object, "__getattribute__")
        if hook is not None:  # e.g. a config mapping attribute aliases: it decides what `obj.name` means
            return function_value(state, hook).call(state, [self, ConstantValue(name)], {})
        return self.generic_getattr(state, name)

    def generic_getattr(self, state, name: str) -> Value:
        """`object.__getattribute__`: data descriptors, the instance dict, the class, then `__getattr__`."""
        pending = state.side_effects.pending_attr(self.obj, name)
        if pending is not None:
            if is_deleted(pending):
                raise GraphBreak("exception", f"AttributeError: {name!r} was deleted")
            return pending
        source = AttrSource(self.source, name)
        cls = type(self.obj)
        if name == "__class__":
            return ClassValue(cls)
        if name == "__dict__" and not isinstance(_class_lookup(cls, name), property):  # a property of its own runs
            base = state.wrap(self.obj.__dict__, source)
            return InstanceDictValue(self, base) if isinstance(base, DictValue) else base
        if name in getattr(self.obj, "__dict__", {}) and not isinstance(getattr(cls, name, None), property):
            return state.wrap(self.obj.__dict__[name], source)
        guard_not_shadowed(state, self, name)
        try:
            return class_attribute(state, self, cls, name, source)
        except GraphBreak as e:
            fallback = python_override(cls, object, "__getattr__")
            if e.reason.id != "exception" or fallback is None or any(name in k.__dict__ for k in cls.__mro__):
                if e.reason.id == "exception":
                    state.guard_hasattr(self.source, name, False)  # the code may catch the AttributeError
                raise
            return function_value(state, fallback).call(state, [self, ConstantValue(name)], {})

    def setattr(self, state, name: str, value: Value) -> None:
        hook = python_override(type(self.obj), object, "__setattr__")
        if hook is not None:
            function_value(state, hook).call(state, [self, ConstantValue(name), value], {})
            return
        self.generic_setattr(state, name, value)

    def generic_setattr(self, state, name: str, value: Value) -> None:
        descriptor = _class_lookup(type(self.obj), name)
        if isinstance(descriptor, property) and isinstance(descriptor.fset, types.FunctionType):
            function_value(state, descriptor.fset).call(state, [self, value], {})
        elif _is_data_descriptor(descriptor):
            raise GraphBreak("unsupported_object",
                             f"assigning {type(self.obj).__name__}.{name} (a {type(descriptor).__name__})")
        else:
            state.side_effects.store_attr(self.obj, self, name, value)

    def delattr(self, state, name: str) -> None:
        """`del obj.name` of an instance attribute: replayed after the graph; later reads see it gone."""
        cls = type(self.obj)
        if python_override(cls, object, "__delattr__") is not None or _is_data_descriptor(_class_lookup(cls, name)):
            raise GraphBreak("unsupported_object", f"del {cls.__name__}.{name} (a __delattr__ or descriptor)")
        pending = state.side_effects.pending_attr(self.obj, name)
        present = not is_deleted(pending) if pending is not None else name in getattr(self.obj, "__dict__", ())
        if not present:
            raise GraphBreak("exception", f"AttributeError: {name!r} (deleting an attribute the instance lacks)")
        state.side_effects.del_attr(self.obj, self, name)

    def call_method(self, state, name: str, args: list[Value], kwargs: dict) -> Value:
        """`object`'s own slots, reached through `super()` from a class that overrides them."""
        if name == "__getattribute__":
            return self.generic_getattr(state, args[0].as_constant())
        if name == "__setattr__":
            self.generic_setattr(state, args[0].as_constant(), args[1])
            return ConstantValue(None)
        raise GraphBreak("unsupported_call", f"object.{name} on a {type(self.obj).__name__}")

    def call(self, state, args, kwargs) -> Value:
        return class_attribute(state, self, type(self.obj), "__call__", None).call(state, args, kwargs)

    def _dunder(self, state, name: str, args: list[Value]) -> Value:
        return class_attribute(state, self, type(self.obj), name, None).call(state, args, {})

    def getitem(self, state, key):
        return self._dunder(state, "__getitem__", [key])

    def length(self, state) -> int:
        return self._dunder(state, "__len__", []).as_constant()

    def truth(self, state) -> bool:
        cls = type(self.obj)
        if hasattr(cls, "__bool__"):
            return self._dunder(state, "__bool__", []).as_constant()
        if hasattr(cls, "__len__"):
            return self.length(state) > 0
        return True

    def unpack(self, state) -> list[Value]:
        if isinstance(self.obj, (list, tuple)):
            raise GraphBreak("unsupported_object", f"iterating a {type(self.obj).__name__} subclass")
        return iterate_instance(state, self, type(self.obj))

    def iterator(self, state) -> IteratorValue:
        return instance_iterator(state, self, type(self.obj))


class InstanceDictValue(DictValue):
    """`obj.__dict__` (or `vars(obj)`) of an existing object: the instance's attributes as a dict.

    It shares its items with the one tracker of that dict (`wrap` keeps one per object), and with
    the object's attributes: an attribute stored earlier in this capture is an item here, and an item
    written here is what a later `obj.name` reads. Its own writes replay as dict stores (no
    `__setattr__` runs, as in eager).
    """

    def __init__(self, owner: ObjectValue, base: DictValue):
        super().__init__({}, base.source)
        self.owner, self.items = owner, base.items

    def _sync(self, state) -> None:
        for name, value in state.side_effects.instance_attrs(self.owner.obj):
            if is_deleted(value):
                self.items.pop(name, None)
            elif self.items.get(name) is not value:
                self.items[name] = value

    def pairs(self, state):
        self._sync(state)
        return super().pairs(state)

    def dict_getitem(self, state, key):
        self._sync(state)
        return super().dict_getitem(state, key)

    def dict_setitem(self, state, key, value):
        self._sync(state)
        super().dict_setitem(state, key, value)
        state.side_effects.shadow_attr(self.owner.obj, key.as_constant(), value)

    def dict_delitem(self, state, key):
        self._sync(state)
        super().dict_delitem(state, key)
        state.side_effects.shadow_attr(self.owner.obj, key.as_constant(), None)


def iterate_instance(state, value: Value, cls: type) -> list[Value]:
    """The items of a user object, by Python's iteration protocol (all of them: `list(obj)`, unpacking)."""
    return instance_iterator(state, value, cls).unpack(state)


def instance_iterator(state, value: Value, cls: type) -> IteratorValue:
    """`iter(obj)` for a user object, by Python's iteration protocol.

    A Python `__iter__` is inlined; what it returns is iterated: a generator or other iterator kiln
    tracks, or an object with a Python `__next__`, called once per item as the loop asks for it. A class
    that leaves iteration to `collections.abc.Sequence` (or to the old `__getitem__` protocol) with a
    `__len__` yields `self[0] .. self[len - 1]`: the same items, without tracing the IndexError that
    ends the protocol's loop.
    """
    iter_fn = getattr(cls, "__iter__", None)
    if isinstance(iter_fn, types.FunctionType) and iter_fn is not collections.abc.Sequence.__iter__:
        iterator = function_value(state, iter_fn).call(state, [value], {}).realize()
        if isinstance(iterator, IteratorValue):
            return iterator
        if isinstance(getattr(iterator.python_type(), "__next__", None), types.FunctionType):
            return UserIteratorValue(state, iterator)
        return IteratorValue(iterator.unpack(state))
    if (iter_fn in (None, collections.abc.Sequence.__iter__)
            and isinstance(getattr(cls, "__len__", None), types.FunctionType)
            and isinstance(getattr(cls, "__getitem__", None), types.FunctionType)):
        n = value.length(state)
        return IteratorValue([value.getitem(state, ConstantValue(i)) for i in range(n)])
    raise GraphBreak("unsupported_object", f"iterating over a {cls.__name__}")


class UserIteratorValue(LazyIteratorValue):
    """An object whose class defines `__next__` in Python: each step inlines it, until it raises StopIteration."""

    def __init__(self, state, obj: Value):
        super().__init__(state)
        self.obj = obj

    def python_type(self) -> type:
        return self.obj.python_type()

    def step(self) -> Value | None:
        next_fn = class_attribute(self.state, self.obj, self.obj.python_type(), "__next__", None)
        try:
            return next_fn.call(self.state, [], {})
        except TracedException as e:
            if issubclass(e.value.cls, StopIteration):
                return None
            raise

    def rebuild(self, writer) -> str:
        return writer.value(self.obj)  # the object itself, in the state its traced `__next__` calls left it

    def __repr__(self):
        return f"Object({type(self.obj).__name__} at {self.source})"


class NewObjectValue(Value):
    """An instance of a user class created during capture; its attributes are trackers."""

    def __init__(self, cls: type):
        self.cls = cls
        self.attrs: dict[str, Value] = {}

    def python_type(self) -> type:
        return self.cls

    def is_constant(self) -> bool:
        """A frozen dataclass of constants is a value (hashable, compared by its fields), as a tuple is: it may
        be a dict key, hashed and compared at capture time. Other objects are identities."""
        params = getattr(self.cls, "__dataclass_params__", None)
        return bool(params is not None and params.frozen and all(v.is_constant() for v in self.attrs.values()))

    def as_constant(self) -> Any:
        if not self.is_constant():
            return super().as_constant()
        return new_object(self.cls, {k: v.as_constant() for k, v in self.attrs.items()})

    def getattr(self, state, name: str) -> Value:
        hook = python_override(self.cls, object, "__getattribute__")
        if hook is not None:  # as for existing objects (a config's attribute aliases)
            return function_value(state, hook).call(state, [self, ConstantValue(name)], {})
        return self.generic_getattr(state, name)

    def generic_getattr(self, state, name: str) -> Value:
        if name == "__dict__" and isinstance(_class_lookup(self.cls, name), types.GetSetDescriptorType):
            # the instance dict (a `__dict__` property of the class's own runs instead, as any property)
            view = DictValue({})
            view.items = self.attrs  # the instance dict itself: writes through it are attribute writes
            return view
        if name == "__class__":
            return ClassValue(self.cls)
        if name in self.attrs and not _is_data_descriptor(_class_lookup(self.cls, name)):
            return self.attrs[name]
        try:
            return class_attribute(state, self, self.cls, name, None)
        except GraphBreak as e:
            fallback = python_override(self.cls, object, "__getattr__")
            if e.reason.id != "exception" or fallback is None:
                raise
            return function_value(state, fallback).call(state, [self, ConstantValue(name)], {})

    def setattr(self, state, name: str, value: Value) -> None:
        """Python's assignment: a `__setattr__` override or a property setter runs; else the instance dict."""
        hook = python_override(self.cls, object, "__setattr__")
        if hook is not None:
            function_value(state, hook).call(state, [self, ConstantValue(name), value], {})
            return
        self.generic_setattr(state, name, value)

    def generic_setattr(self, state, name: str, value: Value) -> None:
        descriptor = _class_lookup(self.cls, name)
        if isinstance(descriptor, property) and isinstance(descriptor.fset, types.FunctionType):
            function_value(state, descriptor.fset).call(state, [self, value], {})
        elif _is_data_descriptor(descriptor):
            raise GraphBreak("unsupported_object",
                             f"assigning {self.cls.__name__}.{name} (a {type(descriptor).__name__})")
        else:
            self.attrs[name] = value

    def delattr(self, state, name: str) -> None:
        if python_override(self.cls, object, "__delattr__") is not None or name not in self.attrs:
            raise GraphBreak("unsupported_object", f"del {self.cls.__name__}.{name}")
        del self.attrs[name]

    def call_method(self, state, name: str, args: list[Value], kwargs: dict) -> Value:
        """`object.__setattr__` / `__getattribute__` reached through `super()`."""
        if name == "__setattr__":
            self.generic_setattr(state, args[0].as_constant(), args[1])
            return ConstantValue(None)
        if name == "__getattribute__":
            return self.generic_getattr(state, args[0].as_constant())
        raise GraphBreak("unsupported_call", f"object.{name} on a {self.cls.__name__}")

    def call(self, state, args, kwargs):
        return class_attribute(state, self, self.cls, "__call__", None).call(state, args, kwargs)

    def getitem(self, state, key):
        return class_attribute(state, self, self.cls, "__getitem__", None).call(state, [key], {})

    def length(self, state) -> int:
        return class_attribute(state, self, self.cls, "__len__", None).call(state, [], {}).as_constant()

    def truth(self, state) -> bool:
        if hasattr(self.cls, "__bool__"):
            return class_attribute(state, self, self.cls, "__bool__", None).call(state, [], {}).truth(state)
        return self.length(state) > 0 if hasattr(self.cls, "__len__") else True

    def unpack(self, state) -> list[Value]:
        return iterate_instance(state, self, self.cls)

    def iterator(self, state) -> IteratorValue:
        return instance_iterator(state, self, self.cls)

    def reconstruct(self, writer) -> str:
        attrs = ", ".join(f"{k!r}: {writer.value(v)}" for k, v in self.attrs.items())  # value(): aliasing kept
        return f"{writer.constant(new_object)}({writer.constant(self.cls)}, {{{attrs}}})"


def new_object(cls: type, attrs: dict) -> Any:
    """Rebuild an object made during capture: its traced `__init__` only set these instance attributes."""
    obj = object.__new__(cls)
    for name, value in attrs.items():
        if hasattr(obj, "__dict__"):
            obj.__dict__[name] = value
        else:  # __slots__
            object.__setattr__(obj, name, value)
    return obj


def _class_lookup(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


def _is_data_descriptor(attr: Any) -> bool:
    """A class attribute that takes over assignment (a property); `__slots__` members store plainly."""
    if isinstance(attr, types.MemberDescriptorType):
        return False
    return hasattr(type(attr), "__set__") or hasattr(type(attr), "__delete__")


class RecordedObjectValue(Value):
    """A dict-like dataclass (transformers' ModelOutput) made during capture: rebuilt by calling the class.

    Reads are answered from the constructor's arguments, as the class stores them:
    by attribute, by key, and by position over the fields that are not None. Like
    the OrderedDict underneath, a field first set later (`out["hidden_states"] = ...`)
    goes to the end of the key order, and the rebuilt object repeats those stores.
    """

    def __init__(self, cls: type, args: list[Value], kwargs: dict[str, Value]):
        self.cls = cls
        names = [f.name for f in dataclasses.fields(cls)]
        self.fields: dict[str, Value] = {n: ConstantValue(None) for n in names}
        self.fields.update(zip(names, args))
        self.fields.update(kwargs)
        self.order = [k for k, v in self.fields.items() if not _is_none(v)]  # the dict's keys, in order
        self.initial = list(self.order)  # the keys the constructor set

    def python_type(self) -> type:
        return self.cls

    def _present(self) -> dict[str, Value]:
        return {k: self.fields[k] for k in self.order}

    def getattr(self, state, name: str) -> Value:
        if name in self.fields:
            return self.fields[name]
        if name in ("to_tuple", "keys", "values", "items", "get"):
            return BoundMethodValue(self, name)
        if hasattr(self.cls, name):
            raise GraphBreak("unsupported_object", f"attribute {name!r} of {self.cls.__name__}")
        raise raise_python(AttributeError, f"{self.cls.__name__!r} object has no attribute {name!r}")

    def setattr(self, state, name: str, value: Value) -> None:
        """`out.field = v`: ModelOutput's `__setattr__` stores a field that is not None as a key too (a new one
        at the end of the order: `text_outputs.pooler_output = proj(...)` where the model had no pooler)."""
        adds_key = name in self.fields and _stores_fields_as_keys(self.cls)
        if _is_none(value) or not (name in self.order or adds_key):  # an attribute outside the dict: not modelled
            raise GraphBreak("unsupported_object", f"setting {self.cls.__name__}.{name} outside its keys")
        self.fields[name] = value
        if name not in self.order:
            self.order.append(name)

    def setitem(self, state, key: Value, value: Value) -> None:
        k = key.as_constant()
        if k not in self.fields or _is_none(value):
            raise GraphBreak("unsupported_object", f"{self.cls.__name__}[{k!r}] = ...")
        self.fields[k] = value
        if k not in self.order:
            self.order.append(k)

    def call_method(self, state, name, args, kwargs) -> Value:
        present = self._present()
        if name == "to_tuple":
            return TupleValue(list(present.values()))
        if name == "get":
            return present.get(args[0].as_constant(), args[1] if len(args) > 1 else ConstantValue(None))
        return DictValue(present).call_method(state, name, args, kwargs)

    def getitem(self, state, key: Value) -> Value:
        k = key.as_constant()
        present = self._present()
        if isinstance(k, str):
            if k not in present:
                raise raise_python(KeyError, k)
            return present[k]
        values = list(present.values())
        return TupleValue(values[k]) if isinstance(k, slice) else values[k]

    def unpack(self, state) -> list[Value]:
        return [ConstantValue(k) for k in self._present()]

    def length(self, state) -> int:
        return len(self._present())

    def reconstruct(self, writer) -> str:
        init = ", ".join(f"{k}={writer.value(self.fields[k])}" for k in self.initial)
        later = [k for k in self.order if k not in self.initial]
        if not later:
            return f"{writer.constant(self.cls)}({init})"
        stores = ", ".join(f"({k!r}, {writer.value(self.fields[k])})" for k in later)
        return f"{writer.constant(rebuild_output)}({writer.constant(self.cls)}({init}), [{stores}])"


def _stores_fields_as_keys(cls: type) -> bool:
    """Whether `cls.__setattr__` is transformers' ModelOutput's, which sets a field's key with its attribute."""
    return getattr(cls.__setattr__, "__qualname__", "") == "ModelOutput.__setattr__"


def rebuild_output(obj: Any, stores: list) -> Any:
    """A ModelOutput whose fields were set after construction: repeat the stores, in order."""
    for key, value in stores:
        obj[key] = value
    return obj


def _is_none(value: Value) -> bool:
    value = value.realize()
    return value.is_constant() and value.as_constant() is None


class PartialValue(Value):
    """A functools.partial: its function, arguments, and (for one made during capture) the attributes written
    to its `__dict__` (functools.partialmethod sets `__self__` on the partial it makes)."""

    def __init__(self, fn: Value, args: list[Value], kwargs: dict[str, Value]):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.attrs: dict[str, Value] = {}

    def python_type(self) -> type:
        return functools.partial

    def call(self, state, args, kwargs) -> Value:
        return self.fn.call(state, [*self.args, *args], {**self.kwargs, **kwargs})

    def getattr(self, state, name: str) -> Value:
        if name in self.attrs:
            return self.attrs[name]
        if name == "args":  # one tuple, read as often as it is (`p.args is p.args`)
            self.attrs["args"] = TupleValue(list(self.args))
            return self.attrs["args"]
        if name == "func" and not isinstance(self.fn.realize(), PartialValue):  # a partial of a partial flattens
            return self.fn
        return super().getattr(state, name)

    def setattr(self, state, name: str, value: Value) -> None:
        if getattr(self, "source", None) is not None or name == "__dict__":  # the user's object: written natively
            super().setattr(state, name, value)
        if name in ("func", "args", "keywords"):
            raise raise_python(AttributeError, "readonly attribute")
        self.attrs[name] = value

    def reconstruct(self, writer) -> str:
        parts = [writer.value(self.fn)] + [writer.value(a) for a in self.args]  # the objects, not copies
        parts += [f"{k}={writer.value(v)}" for k, v in self.kwargs.items()]
        written = {k: v for k, v in self.attrs.items() if k != "args"}
        if written:
            attrs = ", ".join(f"{k!r}: {writer.value(v)}" for k, v in written.items())
            return f"{writer.constant(_partial_with_attributes)}({{{attrs}}}, {', '.join(parts)})"
        return f"{writer.constant(functools.partial)}({', '.join(parts)})"


def _partial_with_attributes(attributes: dict, func, /, *args, **keywords) -> functools.partial:
    made = functools.partial(func, *args, **keywords)
    made.__dict__.update(attributes)
    return made


class SuperValue(Value):
    """`super()` inside an inlined method: attribute lookup starts after `cls` in the MRO."""

    def __init__(self, cls: type, self_value: Value):
        self.cls, self.self_value = cls, self_value

    def _mro(self) -> tuple:
        """The MRO the lookup walks: the instance's class's, or the class's own in a classmethod (`super()`
        with a class as its second argument, as in `Function.apply` or `__init_subclass__`)."""
        bound = self.self_value.realize()
        mro = bound.cls.__mro__ if isinstance(bound, ClassValue) else bound.python_type().__mro__
        if self.cls not in mro:
            raise GraphBreak("unsupported_object", f"super({self.cls.__name__}, ...) of an object outside its MRO")
        return mro

    def getattr(self, state, name: str) -> Value:
        mro = self._mro()
        for klass in mro[mro.index(self.cls) + 1:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, types.FunctionType):
                    return MethodValue(self.self_value, function_value(state, attr))
                if isinstance(attr, classmethod) and isinstance(attr.__func__, types.FunctionType):
                    bound = self.self_value.realize()
                    owner = bound if isinstance(bound, ClassValue) else ClassValue(bound.python_type())
                    return MethodValue(owner, function_value(state, attr.__func__))
                if isinstance(attr, staticmethod) and isinstance(attr.__func__, types.FunctionType):
                    return function_value(state, attr.__func__)
                if attr is object.__init__ or attr is torch.nn.Module.__init__:
                    return BuiltinValue(_noop)
                if klass in _MODELLED_BASES and hasattr(self.self_value.realize(), "call_method"):
                    # super().get(...) in a dict subclass: the builtin behaviour the container tracker models

                    return BoundMethodValue(self.self_value.realize(), name)
                break
        raise GraphBreak("unsupported_object", f"super().{name}")

    def reconstruct(self, writer) -> str:
        """Alive at a break (`super().__init__(f(x))` breaking in `f`): the same proxy, built natively."""
        return f"{writer.constant(super)}({writer.constant(self.cls)}, {writer.value(self.self_value)})"


# builtin containers whose methods the container trackers model, reached by super() from a subclass
_MODELLED_BASES = (dict, list, tuple, set, object, collections.OrderedDict, collections.defaultdict)


def _noop(*args, **kwargs):
    return None


class OpaqueValue(Value):
    """A runtime object kiln does not model: it can be passed around, not operated on."""

    def __init__(self, obj: Any, source=None):
        self.obj, self.source = obj, source

    def python_type(self) -> type:
        return type(self.obj)

    def getattr(self, state, name):
        raise GraphBreak(_reason(self.obj), f"attribute {name!r} of a {type(self.obj).__name__}")

    def call(self, state, args, kwargs):
        if _reason(self.obj) == "numpy" and _plain_numbers(args, kwargs):
            return _fold_numpy(self.obj, args, kwargs)
        raise GraphBreak(_reason(self.obj), f"calling a {type(self.obj).__name__}")

    def unpack(self, state):
        raise GraphBreak(_reason(self.obj), f"iterating over a {type(self.obj).__name__}")

    def truth(self, state):
        raise GraphBreak(_reason(self.obj), f"the truth value of a {type(self.obj).__name__}")

    def reconstruct(self, writer) -> str:
        if self.source is not None:
            return writer.source_expr(self.source)
        return writer.constant(self.obj)

    def __repr__(self):
        return f"Opaque({type(self.obj).__name__})"


def _plain_numbers(args: list[Value], kwargs: dict[str, Value]) -> bool:
    """All arguments are Python numbers known at capture time (`np.sqrt(self.d_model)` in CTRL's forward), or
    symbolic ints, whose value the fold specializes (a guard)."""
    values = [v.realize() for v in [*args, *kwargs.values()]]
    return bool(values) and all(isinstance(v, SymValue) or v.is_constant() and type(v.as_constant()) in (
        int, float, bool) for v in values)


def _fold_numpy(fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """A numpy function of Python numbers, computed at capture time. Its numpy scalar is kept as the Python
    number it equals (what a tensor op does with either is the same; the graph's code can print it)."""
    try:
        result = fn(*(a.as_constant() for a in args), **{k: v.as_constant() for k, v in kwargs.items()})
    except Exception as e:
        raise GraphBreak("numpy", f"{getattr(fn, '__name__', fn)} raised {type(e).__name__}: {e}") from e
    if not (type(result).__module__ == "numpy" and getattr(result, "shape", None) == ()):
        raise GraphBreak("numpy", f"{getattr(fn, '__name__', fn)} returned a {type(result).__name__}")
    return ConstantValue(result.item())


def _reason(obj: Any) -> str:
    return "numpy" if type(obj).__module__.startswith("numpy") else "unsupported_object"
