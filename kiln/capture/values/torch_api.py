"""torch's Python API during capture: functions become graph nodes, a few answer at capture time.

`torch.*`, `torch.nn.functional.*`, `torch.linalg.*` and friends are recorded
as graph nodes as they are. A small table answers the ones that ask about
the world rather than compute (`torch.is_grad_enabled`, `torch.compiler.is_compiling`),
and the grad-mode and autocast context managers change the capture state and
put their switches in the graph.
"""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture import spellings
from kiln.capture.breaks import GraphBreak
from kiln.capture.values.backend_switches import call_switch, is_switch_call
from kiln.capture.values.base import Value
from kiln.capture.values.collectives import is_collective, trace_collective
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.functions import CallableValue
from kiln.capture.values.symbolic import SymValue
from kiln.capture.values.tensor import TensorValue, trace_op

NOT_TRACING: set[Callable] = {torch.jit.is_scripting, torch.jit.is_tracing, torch._C._get_tracing_state}
if hasattr(torch.compiler, "is_exporting"):
    NOT_TRACING.add(torch.compiler.is_exporting)

# Queries about the dispatch state the user's call runs under (no modes, normally): answered at
# capture time, outside the fake mode capture uses. torch 2.11's MultiheadAttention asks
# `_is_make_fx_tracing()` through this in eval mode; as a graph op it returned a list (a break).
WORLD_QUERIES: set[Callable] = {torch._C._get_privateuse1_backend_name}  # fixed once torch is set up
if hasattr(torch.utils._python_dispatch, "_get_current_dispatch_mode_stack"):
    WORLD_QUERIES.add(torch.utils._python_dispatch._get_current_dispatch_mode_stack)

# Functions whose result depends only on the metadata of their arguments.
METADATA_FUNCTIONS = {torch.is_tensor, torch.is_floating_point, torch.is_complex, torch.numel,
                      torch.get_default_dtype}

# Functions with effects outside the graph: a break.
BREAKING = {torch.manual_seed: "unsupported_call", torch.seed: "unsupported_call",
            torch.set_default_dtype: "unsupported_call", torch.save: "unsupported_call",
            torch.load: "unsupported_call", torch.autograd.backward: "autograd_backward",
            torch.autograd.grad: "autograd_backward"}


class TorchFunctionValue(CallableValue):
    def __init__(self, fn: Any, source=None):
        self.fn, self.source = fn, source
        self.obj = fn

    def python_type(self) -> type:
        return type(self.fn)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        """torch's functions and classes are fixed objects (isinstance(x, torch.fx.Proxy), dict keys)."""
        return self.fn

    def call(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        fn = self.fn
        if spellings.is_graph_break(fn):
            raise GraphBreak("explicit", "torch._dynamo.graph_break()")
        if spellings.is_disabled(fn):
            raise GraphBreak("disabled", f"{getattr(fn, '__name__', fn)} is disabled by torch.compiler.disable")
        if spellings.asks_is_compiling(fn):
            return state.answer_is_compiling()
        if is_switch_call(fn):
            return call_switch(state, fn, args, kwargs)
        if state.models(fn):
            return state.call_builtin(fn, args, kwargs)
        if fn in WORLD_QUERIES:
            return ConstantValue(fn(*(a.as_constant() for a in args)))
        if fn in NOT_TRACING:
            return ConstantValue(False if fn is not torch._C._get_tracing_state else None)
        if fn is torch.is_grad_enabled:
            return ConstantValue(state.grad_enabled)
        if fn is torch.is_inference_mode_enabled:
            return ConstantValue(bool(state.inference_mode))
        if fn in BREAKING:
            raise GraphBreak(BREAKING[fn], f"{fn.__name__}()")
        if is_collective(fn):
            return trace_collective(state, fn, args, kwargs)
        if fn is torch.full and _fills_from_tensor(args, kwargs):
            return _full_from_tensor(state, args, kwargs)
        if fn is torch.tensor and args and _holds_symbols(args[0]):
            # torch.tensor(n) of a symbolic int: the C++ constructor reads the value (a specialization);
            # torch's reference implementation builds it with scalar_tensor, which keeps the symbol (as torch does)
            fn = torch._refs.tensor
        if fn in CONTEXTS:
            return CONTEXTS[fn](state, args, kwargs)
        if fn in METADATA_FUNCTIONS or fn in (torch.Size, torch.device, torch.finfo, torch.iinfo, torch.dtype):
            return _metadata_call(fn, args, kwargs)
        if fn is torch.nn.Parameter:
            raise GraphBreak("unsupported_call", "creating an nn.Parameter inside the compiled region")
        if isinstance(fn, type) and issubclass(fn, torch.nn.Module):  # torch.nn.CrossEntropyLoss() in a forward
            from kiln.capture.values.objects import stateless_module

            return stateless_module(state, fn, args, kwargs)
        if isinstance(fn, type) and not issubclass(fn, torch.Tensor):
            raise GraphBreak("unsupported_call", f"constructing {fn.__qualname__}")
        if isinstance(fn, torch._ops.OpOverload):
            args, kwargs = _concrete_int_arguments(fn, args, kwargs)
        return trace_op(state, "call_function", fn, args, kwargs)

    def getattr(self, state, name: str) -> Value:
        attr = getattr(self.fn, name)
        if isinstance(self.fn, type) and issubclass(self.fn, torch.nn.Module) and isinstance(attr, types.FunctionType):
            return state.wrap_unsourced(attr)  # `nn.LayerNorm.forward(self, x)` from a subclass: inlined
        return wrap_torch_attr(attr)

    def reconstruct(self, writer) -> str:
        return writer.constant(self.fn)

    def __repr__(self) -> str:
        return f"TorchFunction({getattr(self.fn, '__name__', self.fn)})"


def _concrete_int_arguments(op: torch._ops.OpOverload, args: list[Value], kwargs: dict[str, Value]):
    """A direct aten call's symbolic ints specialized where its schema takes `int` or `int[]`, not `SymInt`.

    ATen's argument parser accepts no SymInt there (`int[2] kernel_size` of max_pool2d_with_indices_backward
    raises "Expected a value of type 'List[int]'"), and the kernel behind it reads the value anyway; eager
    passes the int, so the graph does too, guarded on its value."""
    schema = op._schema.arguments
    plain = [a.name for a in schema if _takes_plain_ints(a.real_type)]
    if not plain:
        return args, kwargs
    position = {a.name: k for k, a in enumerate(schema) if not a.kwarg_only}
    args = list(args)
    for name in plain:
        k = position.get(name)
        if k is not None and k < len(args):
            args[k] = _specialized(args[k])
        elif name in kwargs:
            kwargs = {**kwargs, name: _specialized(kwargs[name])}
    return args, kwargs


def _takes_plain_ints(kind) -> bool:
    """`int`, `int[]` or an optional one: ints that may not be symbols (`SymInt` has a type of its own)."""
    if isinstance(kind, torch.OptionalType):
        kind = kind.getElementType()
    if isinstance(kind, torch.ListType):
        kind = kind.getElementType()
    return isinstance(kind, torch.IntType)


def _specialized(value: Value) -> Value:
    """`value` as a constant where it is or holds symbolic ints (a list's as_constant reads each item's value,
    which guards it)."""
    return ConstantValue(value.as_constant()) if _holds_symbols(value) else value


def _holds_symbols(data: Value) -> bool:
    """Whether `torch.tensor`'s data is, or nests, a symbolic number (a list of a SymInt and constants)."""
    data = data.realize()
    if isinstance(data, SymValue):
        return True
    items = getattr(data, "items", None)
    return isinstance(items, list) and any(_holds_symbols(item) for item in items)


def _fills_from_tensor(args: list[Value], kwargs: dict[str, Value]) -> bool:
    """`torch.full(size, t)` with a 0-d tensor `t` that does not require grad (eager rejects one that does)."""
    if len(args) != 2 or "out" in kwargs:
        return False
    fill = args[1].realize()
    return isinstance(fill, TensorValue) and fill.fake.dim() == 0 and not fill.fake.requires_grad


def _full_from_tensor(state, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """`torch.full(size, t)` as `torch.empty(size).fill_(t)`: eager reads `t` into a Python number (a
    break); filling from the tensor keeps it in the graph, as torch.compile does. The dtype is the one
    full infers from that number (torch.compile's rewrite takes the default dtype for an integer `t`)."""
    fill = args[1].realize()
    if "dtype" not in kwargs:
        kwargs = {**kwargs, "dtype": ConstantValue(_full_dtype(fill.fake.dtype))}
    empty = trace_op(state, "call_function", torch.empty, [args[0]], kwargs)
    return empty.call_method(state, "fill_", [fill], {})


def _full_dtype(fill_dtype: torch.dtype) -> torch.dtype:
    """The dtype torch.full gives a Python bool, int, float or complex (`t.item()` of a `fill_dtype` tensor)."""
    if fill_dtype == torch.bool:
        return torch.bool
    if fill_dtype.is_complex:
        return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    if fill_dtype.is_floating_point:
        return torch.get_default_dtype()
    return torch.int64


def _metadata_call(fn, args, kwargs) -> Value:
    fake_args = [a.realize().fake if isinstance(a.realize(), TensorValue) else a.as_constant() for a in args]
    return ConstantValue(fn(*fake_args, **{k: v.as_constant() for k, v in kwargs.items()}))


# torch's Python functions that read what no graph op can see (a tensor's `.grad`): a graph node would be
# traced later on fake tensors that have no grads (clip_grad_norm_ would clip nothing and return 0). They
# are inlined like user code instead, so their reads are guarded values and their writes graph ops.
INLINED_TORCH_MODULES = frozenset({"torch.nn.utils.clip_grad"})

# torch.backends' `flags` managers are inlined too: their Python reads and writes the backend switches kiln
# models (values/backend_switches.py), so `with torch.backends.cudnn.flags(...)` stays in the graph.
INLINED_TORCH_FUNCTIONS = frozenset({torch.backends.cudnn.flags, torch.backends.mkldnn.flags})


def inlined_torch_function(obj: Any) -> bool:
    return isinstance(obj, types.FunctionType) and (obj.__module__ in INLINED_TORCH_MODULES
                                                    or obj in INLINED_TORCH_FUNCTIONS)


def wrap_torch_attr(obj: Any) -> Value:
    from kiln.capture.values.objects import PythonModuleValue

    if isinstance(obj, type(torch)):
        return PythonModuleValue(obj)
    if callable(obj) and not isinstance(obj, torch.Tensor):
        return TorchFunctionValue(obj)
    return ConstantValue(obj)


# ------------------------------------------------------------------------------------------
# Context managers: grad mode and autocast
# ------------------------------------------------------------------------------------------

class GradModeContext(Value):
    """`torch.no_grad()`, `torch.enable_grad()`, `torch.set_grad_enabled(b)` as a `with` target."""

    def __init__(self, enabled: bool, applied_on_creation: bool = False, prev: bool | None = None):
        self.enabled, self.applied_on_creation, self.prev = enabled, applied_on_creation, prev

    def python_type(self) -> type:
        return torch.no_grad if not self.enabled else torch.enable_grad

    def enter(self, state) -> Value:
        if not self.applied_on_creation:
            self.prev = state.grad_enabled
            state.set_grad_enabled(self.enabled)
        return ConstantValue(None)

    def exit(self, state) -> None:
        state.set_grad_enabled(self.prev)

    def entered(self) -> bool:
        return self.prev is not None

    def call(self, state, args, kwargs) -> Value:
        """`torch.no_grad()(fn)`, the decorator form: a function that runs `fn` in this grad mode."""
        if len(args) != 1 or kwargs:
            raise GraphBreak("unsupported_call", f"calling {self} with {len(args)} arguments")
        return GradModeFunction(self.enabled, args[0])

    def reconstruct(self, writer) -> str:
        if not self.entered():  # made but not yet entered (`ctx = torch.no_grad()` before a break): a new one
            return f"{writer.constant(self.python_type())}()"
        if writer.reentries:  # inside a block entered again: so is this one, after it (see `Reentry`)
            return writer.reentry(Reentry(torch.set_grad_enabled, (self.enabled,), {}), self.prev)
        return writer.grad_mode_exit(self.prev)

    def __repr__(self) -> str:
        return f"GradMode(enabled={self.enabled})"


class GradModeFunction(CallableValue):
    """A function decorated with `@torch.no_grad()` / `@torch.enable_grad()`: its body inlined in that mode.

    The mode is restored however the body ends (a return, a traced exception, a graph break inside it,
    after which the call runs natively from the outer mode).
    """

    def __init__(self, enabled: bool, fn: Value):
        self.enabled, self.fn = enabled, fn

    def python_type(self) -> type:
        return types.FunctionType  # torch's decorator returns a functools.wraps'd function

    def call(self, state, args, kwargs) -> Value:
        mode = GradModeContext(self.enabled)
        mode.enter(state)
        try:
            return self.fn.call(state, args, kwargs)
        finally:
            mode.exit(state)

    def reconstruct(self, writer) -> str:
        decorator = torch.enable_grad if self.enabled else torch.no_grad
        return f"{writer.constant(decorator)}()({writer.value(self.fn)})"


class AutocastContext(Value):
    def __init__(self, device_type: str, dtype, enabled: bool, cache_enabled):
        self.args = (device_type, dtype, enabled, cache_enabled)
        self.grad_outside: bool | None = None  # grad mode where the block was entered
        self.node = None
        self.real = None

    def python_type(self) -> type:
        return torch.autocast

    def enter(self, state) -> Value:
        self.grad_outside = state.grad_enabled
        state.enter_autocast(self)
        return ConstantValue(None)

    def exit(self, state) -> None:
        state.exit_autocast(self)

    def reentry(self) -> Reentry:
        device, dtype, enabled, cache_enabled = self.args
        return Reentry(torch.autocast, (device,), {"dtype": dtype, "enabled": enabled, "cache_enabled": cache_enabled})

    def reconstruct(self, writer) -> str:
        if self.real is None:  # made but not entered: kiln rebuilds only a block it is inside
            raise GraphBreak("unknown_context", "an autocast object used outside its `with` block")
        return writer.reentry(self.reentry(), self.grad_outside)


class InferenceModeContext(GradModeContext):
    """`torch.inference_mode()`: inside the graph, a block without gradients (as `no_grad`).

    Tensors it makes are ordinary tensors in the graph; `torch.is_inference_mode_enabled()` answers
    True inside it. A break inside the block runs the breaking instruction in the real inference mode.
    Capture's fake tensors are inference tensors where eager's are (the capture state runs the block's fake ops
    in inference mode), so a use eager forbids outside the block runs the frame natively, to raise eager's error.
    """

    def __init__(self):
        super().__init__(False)

    def python_type(self) -> type:
        return torch.inference_mode

    def enter(self, state) -> Value:
        state.inference_mode += 1
        return super().enter(state)

    def exit(self, state) -> None:
        state.inference_mode -= 1
        super().exit(state)

    def reentry(self) -> Reentry:
        return Reentry(torch.inference_mode, (True,), {})

    def reconstruct(self, writer) -> str:
        if not self.entered():
            return f"{writer.constant(torch.inference_mode)}()"
        return writer.reentry(self.reentry(), self.prev)


class Reentry:
    """A `with` block of a manager kiln traces into the graph (autocast, inference mode), live at a break.

    The output program runs the breaking instruction inside the real manager (`manager()`), and passes this
    object on the stack, where the block's `__exit__` was: the continuation enters the block again at its
    start (`kiln.capture.entry`), so its graph holds the rest of the block, and the block ends where the
    user's code ends it.
    """

    def __init__(self, factory: Callable, args: tuple, kwargs: dict):
        self.factory, self.args, self.kwargs = factory, args, kwargs

    def key(self) -> tuple:
        return (self.factory, self.args, tuple(sorted(self.kwargs.items())))

    def manager(self):
        return self.factory(*self.args, **self.kwargs)

    def enter(self, state) -> Value:
        """The block entered again in a continuation's capture: the `__exit__` the stack holds."""
        args = [ConstantValue(a) for a in self.args]
        ctx = CONTEXTS[self.factory](state, args, {k: ConstantValue(v) for k, v in self.kwargs.items()})
        ctx.enter(state)
        return ExitValue(ctx)

    def __call__(self, kind, value, traceback) -> bool:
        """The block's `__exit__`, called where a continuation is stepped through natively (re-run to raise eager's
        error, `kiln.capture.rerun`): the output program runs each of its instructions inside the real manager,
        which it leaves itself, so leaving the block is what the manager's `__exit__` answers: these managers
        suppress no exception."""
        return False

    def __repr__(self) -> str:
        return f"Reentry({getattr(self.factory, '__name__', self.factory)}, {self.args}, {self.kwargs})"


class ExitValue(Value):
    """The `__exit__` CPython keeps on the stack for the duration of a `with` block."""

    def __init__(self, ctx: Value):
        self.ctx = ctx

    def call(self, state, args, kwargs) -> Value:
        self.ctx.exit(state)
        return ConstantValue(None)

    def reconstruct(self, writer) -> str:
        return self.ctx.reconstruct(writer)


def _no_grad(state, args, kwargs):
    return GradModeContext(False)


def _enable_grad(state, args, kwargs):
    return GradModeContext(True)


def _set_grad_enabled(state, args, kwargs):
    enabled = (args[0] if args else kwargs["mode"]).as_constant()
    prev = state.grad_enabled
    state.set_grad_enabled(bool(enabled))
    return GradModeContext(bool(enabled), applied_on_creation=True, prev=prev)


def _inference_mode(state, args, kwargs):
    mode = (args[0] if args else kwargs.get("mode", ConstantValue(True))).as_constant()
    if mode:
        return InferenceModeContext()
    if state.inference_mode:
        raise GraphBreak("unknown_context", "torch.inference_mode(False) inside an inference-mode block")
    return GradModeContext(state.grad_enabled)  # outside inference mode, inference_mode(False) changes nothing


def _autocast(default_device: str | None):
    def make(state, args, kwargs):
        values = [a.as_constant() for a in args]
        options = {k: v.as_constant() for k, v in kwargs.items()}
        device = default_device or (values.pop(0) if values else options.pop("device_type"))
        names = ["dtype", "enabled", "cache_enabled"]
        options.update(zip(names, values))
        dtype = options.get("dtype") or torch.get_autocast_dtype(device)
        return AutocastContext(device, dtype, options.get("enabled", True), options.get("cache_enabled"))

    return make


CONTEXTS: dict[Any, Callable] = {
    torch.no_grad: _no_grad,
    torch.enable_grad: _enable_grad,
    torch.set_grad_enabled: _set_grad_enabled,
    torch.inference_mode: _inference_mode,
    torch.autocast: _autocast(None),
    torch.amp.autocast: _autocast(None),
    torch.cpu.amp.autocast: _autocast("cpu"),
    torch.cuda.amp.autocast: _autocast("cuda"),
}


class GradModeRestore:
    """The `__exit__` of a grad-mode block, rebuilt for a continuation that resumes inside the block."""

    def __init__(self, prev: bool):
        self.prev = prev

    def __call__(self, *exc_info) -> None:
        torch._C._set_grad_enabled(self.prev)
