"""Callables during capture: user functions (inlined), methods, closures and cells.

Calling a Python function traced code can see into — a user function, a
lambda, a closure made by MAKE_FUNCTION, a method — inlines it: its bytecode
is interpreted in a child frame that shares the graph, guards and side
effects. Builtins and torch functions live in `builtins.py` and `torch_api.py`.
"""
from __future__ import annotations

import types
from typing import Any

import torch._compile

from kiln.capture import routes, spellings
from kiln.capture.breaks import GraphBreak
from kiln.capture.sources import AttrSource, ItemSource
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.exceptions import TracedException, raise_python

# The wrapper torch puts on its own functions that compilers must not trace (Optimizer.zero_grad, hooks
# machinery): such a call runs natively, as torch.compile runs it.
TORCH_DISABLED_CODE = torch._compile._disable_dynamo(lambda: None).__code__


class CallableValue(Value):
    """A function-like value. Functions define no `__bool__` or `__len__`: they are always true
    (`if validator := table.get(key):` must not need the function as a constant)."""

    def truth(self, state) -> bool:
        return True


class CellValue(Value):
    """A closure cell. Cells of the user's world are read through their source; new ones hold a tracker."""

    def __init__(self, contents: Value | None = None, real: types.CellType | None = None, source=None):
        self.contents, self.real, self.source = contents, real, source

    def load(self, state) -> Value:
        if self.contents is not None:
            return self.contents
        if self.real is None:
            raise GraphBreak("exception", "free variable referenced before assignment")
        pending = state.side_effects.pending_attr(self.real, "cell_contents")
        if pending is not None:
            return pending
        try:
            contents = self.real.cell_contents
        except ValueError:  # an empty cell: the frame runs natively and raises Python's NameError
            raise GraphBreak("exception", "free variable referenced before assignment") from None

        return state.wrap_lazy(contents, AttrSource(self.source, "cell_contents"))

    def store(self, state, value: Value) -> None:
        if self.real is None:
            self.contents = value
            return
        state.side_effects.store_attr(self.real, self, "cell_contents", value)

    def reconstruct(self, writer) -> str:
        """A new cell is made empty and filled once every value is rebuilt: a recursive nested
        function is in its own closure (`def h(n): ... h(n - 1)`), so its cell and the function
        refer to each other, and the cell must hold the very function object the locals hold."""
        if self.source is not None:
            return writer.source_expr(self.source)
        cell = writer.declare(self, f"{writer.constant(types.CellType)}()")
        if self.contents is not None:
            writer.after_values(lambda: f"{cell}.cell_contents = {writer.value(self.contents)}")
        return cell


class FunctionValue(CallableValue):
    """A Python function to inline: a real one (with a source) or one made by MAKE_FUNCTION."""

    def __init__(self, code: types.CodeType, globals_: dict, name: str, defaults: tuple[Value, ...] = (),
                 kwdefaults: dict[str, Value] | None = None, closure: tuple[CellValue, ...] = (),
                 real: types.FunctionType | None = None, source=None):
        self.code, self.globals, self.name = code, globals_, name
        self.defaults, self.kwdefaults, self.closure = defaults, kwdefaults or {}, closure
        self.real, self.source = real, source
        self.obj = real
        # A function made during capture: its attributes written so far (`f.calls = 0`, what functools.wraps
        # copies), and its annotations as MAKE_FUNCTION gave them (name, value, name, value, ...)
        self.attrs: dict[str, Value] = {}
        self.annotations: tuple[Value, ...] | None = None

    @classmethod
    def of(cls, state, fn: types.FunctionType, source) -> FunctionValue:
        defaults = tuple(
            state.wrap_lazy(d, ItemSource(AttrSource(source, "__defaults__"), i))
            for i, d in enumerate(fn.__defaults__ or ())
        )
        kwdefaults = {
            k: state.wrap_lazy(d, ItemSource(AttrSource(source, "__kwdefaults__"), k))
            for k, d in (fn.__kwdefaults__ or {}).items()
        }
        closure = tuple(
            CellValue(real=c, source=ItemSource(AttrSource(source, "__closure__"), i))
            for i, c in enumerate(fn.__closure__ or ())
        )
        return cls(fn.__code__, fn.__globals__, fn.__name__, defaults, kwdefaults, closure, real=fn, source=source)

    def python_type(self) -> type:
        return types.FunctionType

    def call(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if self.real is not None and spellings.asks_is_compiling(self.real):
            return state.answer_is_compiling()
        if self.real is not None and spellings.is_graph_break(self.real):
            raise GraphBreak("explicit", f"{self.real.__module__}.graph_break()")
        if self.real is not None and spellings.is_disabled(self.real):
            raise GraphBreak("disabled", f"{self.name} is disabled for compilation (kiln.disable or "
                                         "torch.compiler.disable)")
        route = routes.find(self.real) if self.real is not None else None
        if route is not None and route.deferred:
            state.side_effects.deferred_call(self, args, kwargs)
            state.grads_reset = True
            return ConstantValue(None)
        if route is not None:
            raise GraphBreak(route.reason_id, f"{self.name}()")
        if self.code is TORCH_DISABLED_CODE:
            raise GraphBreak("disabled", f"{self.name} is marked by torch to run eagerly under compilers "
                             "(torch._disable_dynamo)")

        if self.real is not None and state.models(self.real):  # Python functions kiln models, not inlines
            return state.call_builtin(self.real, args, kwargs)
        return state.inline(self, args, kwargs)

    def getattr(self, state, name: str) -> Value:
        if name == "__name__":
            return ConstantValue(self.name)
        if name == "__get__":  # descriptors written in Python bind the function they hold (functools.partialmethod)
            return _FunctionGet(self)
        if self.real is not None and self.source is not None:
            try:
                return state.wrap(getattr(self.real, name), AttrSource(self.source, name))
            except AttributeError as e:
                raise raise_python(AttributeError, *e.args) from None
        if self.real is not None:
            raise GraphBreak("unsupported_object", f"attribute {name!r} of function {self.name}")
        return self._made_attr(name)

    def _made_attr(self, name: str) -> Value:
        """An attribute of a function made during capture, as CPython's function object answers it."""
        if name in self.attrs:
            return self.attrs[name]
        if name == "__annotations__":  # made on first read and kept, as CPython does
            from kiln.capture.values.dicts import DictValue

            pairs = self.annotations or ()
            self.attrs[name] = DictValue({pairs[i].as_constant(): pairs[i + 1] for i in range(0, len(pairs), 2)})
            return self.attrs[name]
        made = {"__qualname__": self.code.co_qualname, "__doc__": _docstring(self.code),
                "__module__": self.globals.get("__name__"), "__code__": self.code}
        if hasattr(types.FunctionType, "__type_params__"):  # Python 3.12+: () for a def without type parameters
            made["__type_params__"] = ()
        if name in made:
            return _OwnAttribute(made[name], self, name)
        if hasattr(types.FunctionType, name):  # __defaults__, __closure__, __get__, ...: not modelled
            raise GraphBreak("unsupported_object", f"attribute {name!r} of function {self.name}")
        raise raise_python(AttributeError, f"'function' object has no attribute {name!r}")

    def setattr(self, state, name: str, value: Value) -> None:
        """Writing an attribute of a function made during capture: kept here, and set when it is rebuilt."""
        if self.real is not None or (hasattr(types.FunctionType, name) and name not in _WRITABLE):
            raise GraphBreak("unsupported_object", f"setting {name!r} of function {self.name}")
        if name == "__name__":
            if not (value.is_constant() and isinstance(value.as_constant(), str)):
                raise GraphBreak("unsupported_object", f"__name__ of function {self.name} set to {value}")
            self.name = value.as_constant()
            return
        self.attrs[name] = value

    def delattr(self, state, name: str) -> None:
        if self.real is not None or name not in self.attrs or name in _WRITABLE:
            raise GraphBreak("unsupported_object", f"deleting {name!r} of function {self.name}")
        del self.attrs[name]

    def dict_items(self, state) -> dict[str, Value]:
        """What the function's `__dict__` holds: its attributes less those CPython keeps in slots."""
        if self.real is not None:
            return {k: self.getattr(state, k) for k in vars(self.real)}
        return {k: v for k, v in self.attrs.items() if k not in _WRITABLE}

    def reconstruct(self, writer) -> str:
        if self.source is not None:
            return writer.source_expr(self.source)
        if self.real is not None:
            return writer.constant(self.real)
        defaults = "(" + "".join(d.reconstruct(writer) + ", " for d in self.defaults) + ")"
        closure = "(" + "".join(writer.value(c) + ", " for c in self.closure) + ")"  # one cell object each"
        made = (f"{writer.constant(types.FunctionType)}({writer.constant(self.code)}, {writer.constant(self.globals)}, "
                f"{self.name!r}, {defaults}, {closure})")
        attrs = dict(self.attrs)
        if self.kwdefaults:
            attrs["__kwdefaults__"] = _KeywordDefaults(self.kwdefaults)
        if self.annotations and "__annotations__" not in attrs:
            attrs["__annotations__"] = self._made_attr("__annotations__")
        if not attrs:
            return made
        fn = writer.declare(self, made)  # attributes may refer to the function itself (`__wrapped__` chains)
        for name, value in attrs.items():
            writer.after_values(lambda name=name, value=value: f"{fn}.{name} = {writer.value(value)}")
        return fn

    def __repr__(self) -> str:
        return f"Function({self.name})"


# Function attributes kept in the function object's own slots, not its __dict__ (all writable)
_WRITABLE = ("__name__", "__qualname__", "__doc__", "__module__", "__annotations__", "__kwdefaults__",
             "__type_params__")  # the last from Python 3.12 on, which functools.wraps copies


def _docstring(code: types.CodeType) -> str | None:
    """A new function's `__doc__`: the first constant of its code when that is a string (CPython's rule)."""
    return code.co_consts[0] if code.co_consts and isinstance(code.co_consts[0], str) else None


class _OwnAttribute(ConstantValue):
    """An attribute a new function gets from its code and globals (`__qualname__`, `__doc__`, `__module__`),
    rebuilt as a read of the rebuilt function's attribute: the very object, as `functools.wraps` copies it
    (`wrapper.__doc__ is f.__doc__`), where a literal would be an equal copy."""

    def __init__(self, value: Any, owner: FunctionValue, name: str):
        super().__init__(value)
        self.owner, self.name = owner, name

    def reconstruct(self, writer) -> str:
        return f"{writer.value(self.owner)}.{self.name}"


class _KeywordDefaults(Value):
    """The keyword-only defaults of a rebuilt function, as the dict `__kwdefaults__` is set to."""

    def __init__(self, items: dict[str, Value]):
        self.items = items

    def reconstruct(self, writer) -> str:
        return "{" + ", ".join(f"{k!r}: {writer.value(v)}" for k, v in self.items.items()) + "}"


def update_wrapper(state, wrapper: Value, wrapped: Value, assigned, updated) -> Value:
    """`functools.update_wrapper(wrapper, wrapped)` (what `@functools.wraps` does) for a wrapper made during
    capture: the attributes of `assigned` wrapped has, `__dict__` merged for each of `updated`, `__wrapped__`."""
    wrapper = wrapper.realize()
    if not isinstance(wrapper, FunctionValue) or wrapper.real is not None:
        raise GraphBreak("unsupported_call", "functools.update_wrapper of a function capture did not make")
    for name in assigned:
        try:
            value = wrapped.realize().getattr(state, name)
        except TracedException as e:
            if not issubclass(e.value.cls, AttributeError):
                raise
            continue
        wrapper.setattr(state, name, value)
    for name in updated:
        if name != "__dict__":
            raise GraphBreak("unsupported_call", f"functools.update_wrapper merging {name!r}")
        source = wrapped.realize()
        items = source.dict_items(state) if isinstance(source, FunctionValue) else _plain_dict_items(state, source)
        for key, value in items.items():
            wrapper.setattr(state, key, value)
    wrapper.setattr(state, "__wrapped__", wrapped)
    return wrapper


def _plain_dict_items(state, value: Value) -> dict[str, Value]:
    """`vars(value)` of a callable that is not a Python function: none for C functions and constants."""
    obj = getattr(value, "fn", getattr(value, "obj", None))
    if obj is None or not getattr(obj, "__dict__", None):
        if isinstance(value, BuiltinValue) or value.is_constant():
            return {}
        raise GraphBreak("unsupported_call", f"functools.update_wrapper reading __dict__ of {value}")
    return {k: value.getattr(state, k) for k in vars(obj)}


class _FunctionGet(CallableValue):
    """`fn.__get__(obj, cls=None)`: the function itself for obj None, else the method bound to obj."""

    def __init__(self, fn: FunctionValue):
        self.fn = fn

    def python_type(self) -> type:
        return types.MethodWrapperType

    def call(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        if kwargs or not 1 <= len(args) <= 2:
            raise GraphBreak("unsupported_call", "function.__get__ with other arguments than (obj, cls)")
        bound = args[0].realize()
        if bound.is_constant() and bound.as_constant() is None:
            return self.fn
        return MethodValue(bound, self.fn)

    def reconstruct(self, writer) -> str:
        return f"{writer.value(self.fn)}.__get__"


class MethodValue(CallableValue):
    """A Python function bound to a tracked `self` (a module's forward, an object's method)."""

    def __init__(self, self_value: Value, fn: FunctionValue, source=None):
        self.self_value, self.fn, self.source = self_value, fn, source

    def python_type(self) -> type:
        return types.MethodType

    def call(self, state, args, kwargs) -> Value:
        return self.fn.call(state, [self.self_value, *args], kwargs)

    def getattr(self, state, name):
        if name == "__self__":
            return self.self_value
        if name == "__func__":
            return self.fn
        return self.fn.getattr(state, name)

    def reconstruct(self, writer) -> str:
        if self.source is not None:
            return writer.source_expr(self.source)
        return f"{writer.constant(types.MethodType)}({writer.value(self.fn)}, {writer.value(self.self_value)})"


class BoundMethodValue(CallableValue):
    """A method of a tracked value that the value implements itself (`list.append`, `dict.items`)."""

    def __init__(self, self_value: Value, name: str):
        self.self_value, self.name = self_value, name

    def python_type(self) -> type:
        return types.BuiltinMethodType  # [].append, {}.get: methods of C types

    def call(self, state, args, kwargs) -> Value:
        return self.self_value.call_method(state, self.name, args, kwargs)

    def reconstruct(self, writer) -> str:
        return f"{writer.value(self.self_value)}.{self.name}"  # the receiver itself, not a copy of it


class BuiltinValue(CallableValue):
    """A C function or other callable kiln knows how to model (see builtins.HANDLERS), else a break."""

    def __init__(self, fn: Any, source=None):
        self.fn, self.source = fn, source
        self.obj = fn

    def python_type(self) -> type:
        return type(self.fn)

    def call(self, state, args, kwargs) -> Value:
        return state.call_builtin(self.fn, args, kwargs)

    def getattr(self, state, name):
        try:
            return ConstantValue(getattr(self.fn, name))
        except AttributeError as e:
            raise raise_python(AttributeError, *e.args) from None

    def reconstruct(self, writer) -> str:
        if self.source is not None:
            return writer.source_expr(self.source)
        return writer.constant(self.fn)

    def __repr__(self):
        return f"Builtin({getattr(self.fn, '__qualname__', self.fn)})"


_CACHEABLE_RESULTS = (type(None), bool, int, float, str, bytes)


class CachedFunctionValue(CallableValue):
    """A function wrapped by functools.lru_cache or functools.cache.

    Called with constant arguments, it is called for real at capture time and its result, when an immutable
    constant, folds into the capture: this is what the cache answers on every later call, and the wrapped
    function runs at most once per arguments, as in eager (transformers' cached version checks read package
    metadata that capture could not trace). Otherwise the wrapped function is traced and the cache skipped, as
    torch.compile does.
    """

    def __init__(self, wrapper: Any, wrapped: Value, source=None):
        self.obj, self.wrapped, self.source = wrapper, wrapped, source

    def python_type(self) -> type:
        return type(self.obj)

    def call(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        values = [*args, *kwargs.values()]
        if all(v.realize().is_constant() for v in values):
            try:
                result = self.obj(*(a.as_constant() for a in args), **{k: v.as_constant() for k, v in kwargs.items()})
            except Exception:  # noqa: BLE001  unhashable arguments, or it raised: traced below, raising eager's
                pass
            else:
                if type(result) in _CACHEABLE_RESULTS:
                    return ConstantValue(result)
        return self.wrapped.call(state, args, kwargs)

    def getattr(self, state, name: str) -> Value:
        if name == "__wrapped__":
            return self.wrapped
        raise GraphBreak("unsupported_object", f"attribute {name!r} of an lru_cache wrapper")

    def reconstruct(self, writer) -> str:
        return writer.source_expr(self.source) if self.source is not None else writer.constant(self.obj)
