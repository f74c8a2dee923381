"""Wrapping the user's real objects as trackers, installing the guards each one needs.

`wrap(state, obj, source)` is the only place that turns something from the
user's world into a tracker, so it is the only place that decides what to
guard: a tensor's metadata, a constant's value, a module's identity, a
container's length. `wrap_lazy` defers all of that until the value is used.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import os
import types
from typing import Any

import sympy
import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from kiln.capture import spellings
from kiln.capture.breaks import GraphBreak
from kiln.capture.graph import symbolic_dims
from kiln.capture.guards import Guard, GuardKind, constant_check, describe_tensor, input_aliasing, tensor_signature
from kiln.capture.sources import (
    AttrSource,
    ItemSource,
    LocalSource,
    ScalarTensorSource,
    SizeFloatSource,
    Source,
    fast_expr,
)
from kiln.capture.tensor_checks import NATIVE_TYPES
from kiln.capture.values.base import LazyValue, UnguardedValue, Value
from kiln.capture.values.collectives import DISTRIBUTED_HANDLES
from kiln.capture.values.constant import TORCH_DESCRIPTORS, ConstantValue, ScalarInputValue, is_literal
from kiln.capture.values.containers import ListValue, TupleValue, python_override
from kiln.capture.values.deferred import LoggerValue, is_logger
from kiln.capture.values.dicts import DictValue
from kiln.capture.values.environ import EnvironValue
from kiln.capture.values.functions import BuiltinValue, CachedFunctionValue, FunctionValue, MethodValue
from kiln.capture.values.modules import ModuleValue
from kiln.capture.values.objects import ClassValue, ObjectValue, OpaqueValue, PartialValue, PythonModuleValue
from kiln.capture.values.symbolic import SymValue
from kiln.capture.values.tensor import TensorValue
from kiln.capture.values.torch_api import ExitValue, GradModeContext, GradModeRestore, TorchFunctionValue
from kiln.size_python import SIZE_NAMES, size_source


def wrap_lazy(state, obj: Any, source: Source) -> Value:
    if isinstance(obj, (nn.Module, types.FunctionType, type, types.ModuleType)):
        return wrap(state, obj, source)  # cheap identity guards; realizing later gains nothing
    return LazyValue(state, obj, source)


def is_cached_function(obj: Any) -> bool:
    """A Python function wrapped by functools.lru_cache or functools.cache."""
    return isinstance(obj, functools._lru_cache_wrapper) and isinstance(obj.__wrapped__, types.FunctionType)


def wrap(state, obj: Any, source: Source) -> Value:
    if state.opaque_inputs:
        return UnguardedValue(source)
    expr = state.source_expr(source)
    if isinstance(obj, GradModeRestore):  # resuming inside a `with torch.no_grad():` block
        # the mode its exit restores is the caller's, which the program's exit writes as a constant
        state.guards.add(Guard(GuardKind.EQUALS_MATCH, source, f"{expr}.prev is {obj.prev!r}", repr(obj.prev),
                               f"{expr}.prev"))
        return ExitValue(GradModeContext(not obj.prev, applied_on_creation=True, prev=obj.prev))
    if type(obj) in (torch.no_grad, torch.enable_grad) and isinstance(source, LocalSource):
        # a local made before a break (`ctx = torch.no_grad()`), entered after it: one entry serves every such
        # object, as for one made inside (torch's own, a decorator's, stay objects whose methods are inlined)
        _type(state, obj, source, expr)
        return GradModeContext(type(obj) is torch.enable_grad)
    if isinstance(obj, torch.Tensor):
        return _tensor(state, obj, source, expr)
    if isinstance(obj, (list, dict)) and id(obj) in state.mutable_values:
        return _alias(state, obj, source, expr)
    if isinstance(obj, nn.Module):
        _module(state, obj, source, expr)
        return ModuleValue(obj, source)
    if isinstance(obj, (bool, type(None))):
        state.guards.add(Guard(GuardKind.EQUALS_MATCH, source, f"{expr} is {obj!r}", repr(obj), expr))
        return ConstantValue(obj, source)
    if type(obj) in (int, float, str, bytes) or isinstance(obj, (*TORCH_DESCRIPTORS, torch.Size)) or (
            type(obj) is tuple and is_literal(obj)):
        name = state.guards.constant(obj, "const") if not is_literal(obj) else repr(obj)
        state.guards.add(Guard(GuardKind.TYPE_MATCH, source, f"type({expr}) is {_type_name(state, obj)}",
                               type(obj).__name__, f"type({expr}).__name__"))
        if type(obj) is int and is_symbolic_int(state, obj, source):
            return _int_input(state, obj, source)
        origin = (source, obj) if _is_frame_input(state, source, through_modules=type(obj) is float) else None

        def guard_value():
            state.guards.add(Guard(GuardKind.EQUALS_MATCH, source, constant_check(expr, obj, name), repr(obj), expr))
            if origin is not None:
                state.specialized_scalars.append(origin)  # for automatic dynamic (entry.CompiledFrame)

        if type(obj) in (int, float):  # guarded by use (see ScalarInputValue)
            return ScalarInputValue(obj, source, guard_value, as_tensor=_scalar_tensor_maker(state, obj, source),
                                    origin=origin)
        guard_value()
        return ConstantValue(obj, source)
    if isinstance(obj, (enum.Enum, types.CodeType, *DISTRIBUTED_HANDLES)):  # identity pins every attribute
        guard_identity(state, obj, source, expr)
        return ConstantValue(obj, source)
    if type(obj) in (tuple, list) or (isinstance(obj, tuple) and hasattr(type(obj), "_fields")):
        _type(state, obj, source, expr)
        state.guards.add(Guard(GuardKind.LENGTH_MATCH, source, f"len({expr}) == {len(obj)}", str(len(obj)),
                               f"len({expr})"))
        items = [wrap_lazy(state, v, ItemSource(source, i)) for i, v in enumerate(obj)]
        if isinstance(obj, list):
            return _remember(state, obj, source, ListValue(items, source))
        return TupleValue(items, cls=type(obj), source=source)
    if type(obj) is dict or (isinstance(obj, dict) and not dataclasses.is_dataclass(obj)):
        if all(is_literal(k) or _is_fixed_object(k) for k in obj):
            _type(state, obj, source, expr)
            keys = list(obj.keys())
            keys_expr = repr(keys) if all(is_literal(k) for k in keys) else state.guards.constant(keys, "keys")
            state.guards.add(Guard(GuardKind.DICT_KEYS, source, constant_check(f"list({expr}.keys())", keys, keys_expr),
                                   repr(keys), f"list({expr}.keys())"))
            stored = python_override(type(obj), dict, "__getitem__") is not None
            value = DictValue({k: wrap_lazy(state, v, ItemSource(source, _key_ref(state, k), stored))
                               for k, v in dict.items(obj)}, source, type(obj))
            if isinstance(obj, collections.defaultdict):
                value.default_factory = wrap_lazy(state, obj.default_factory, AttrSource(source, "default_factory"))
            return _remember(state, obj, source, value)
    if _is_typing_object(obj):  # Union[...], Literal[...], int | None: immutable annotations
        guard_identity(state, obj, source, expr)
        return ConstantValue(obj, source)
    if isinstance(obj, types.FunctionType):
        _function_guard(state, obj, source, expr)
        return FunctionValue.of(state, obj, source)
    if is_cached_function(obj):  # functools.lru_cache / cache (values/functions.py)
        guard_identity(state, obj, source, expr)
        return CachedFunctionValue(obj, wrap(state, obj.__wrapped__, AttrSource(source, "__wrapped__")), source)
    if isinstance(obj, types.MethodType) and isinstance(obj.__func__, types.FunctionType):
        self_value = wrap(state, obj.__self__, AttrSource(source, "__self__"))
        return MethodValue(self_value, wrap(state, obj.__func__, AttrSource(source, "__func__")), source)
    if isinstance(obj, type):
        guard_identity(state, obj, source, expr)
        return ClassValue(obj, source)
    if isinstance(obj, types.ModuleType):
        guard_identity(state, obj, source, expr)
        return PythonModuleValue(obj)
    if _is_torch_callable(obj):
        guard_identity(state, obj, source, expr)
        return TorchFunctionValue(obj, source)
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType)):
        guard_identity(state, obj, source, expr)
        return BuiltinValue(obj, source)
    if type(obj).__module__.startswith("numpy") or isinstance(obj, (types.GeneratorType,)):
        _type(state, obj, source, expr)
        return OpaqueValue(obj, source)
    if obj is os.environ:
        return EnvironValue(source)
    if type(obj) is functools.partial:  # immutable: its identity pins func, args and keywords
        guard_identity(state, obj, source, expr)
        return _partial(state, obj, source)
    if is_logger(obj):
        _type(state, obj, source, expr)
        return LoggerValue(obj, source)
    if hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__"):
        _type(state, obj, source, expr)
        return ObjectValue(obj, source)
    _type(state, obj, source, expr)
    return OpaqueValue(obj, source)


def _module(state, m: nn.Module, source: Source, expr: str) -> None:
    """A module is guarded by its class, not its identity, as torch.compile guards a module it inlines: what
    capture reads of it (its parameters and buffers, which are graph inputs, its submodules, hooks, training
    flag and attributes) is guarded where it is read, so another instance of the class that matches all of that
    (the twelve layers of a decoder) runs the same entry. One module reached through two sources (a submodule
    shared by two layers) is guarded to stay one object: the capture's view of its attributes is shared."""
    first = state.mutable_values.setdefault(("module", id(m)), (None, source))[1]
    if first != source:
        first_expr = state.source_expr(first)
        state.guards.add(Guard(GuardKind.ID_MATCH, source, f"{expr} is {first_expr}",
                               f"the same module as {first_expr}", "'a different module'"))
    else:
        state.guards.add(Guard(GuardKind.MODULE_TYPE, source, f"type({expr}) is {_type_name(state, m)}",
                               type(m).__name__, f"type({expr}).__name__"))
    state.module_sources.add(source)
    if isinstance(source, LocalSource):
        state.instances[source.local] = m
    for written, written_source in state.written_modules:
        _guard_distinct(state, m, source, written, written_source)


def module_written(state, m: nn.Module, source: Source) -> None:
    """Traced code writes an attribute of `m`: capture's view of its attributes (the side-effect overlay) is
    shared only with the sources that are `m`, so `m` must stay apart from every other module of its class that
    capture reached (`self.first.calls += 1; self.second.calls += 1` counts twice on one shared module)."""
    if any(written is m for written, _ in state.written_modules):
        return
    state.written_modules.append((m, source))
    for key, (_, other_source) in list(state.mutable_values.items()):
        if isinstance(key, tuple) and key[0] == "module":
            _guard_distinct(state, state.real_value(other_source), other_source, m, source)


def _guard_distinct(state, m: nn.Module, source: Source, other: nn.Module, other_source: Source) -> None:
    if m is other or type(m) is not type(other):  # one object: guarded by `_module`; two classes: by type guards
        return
    expr, other_expr = state.source_expr(source), state.source_expr(other_source)
    state.guards.add(Guard(GuardKind.ID_MATCH, source, f"not ({expr} is {other_expr})",
                           f"not the same module as {other_expr}", "'the same module'"))


def _partial(state, obj: functools.partial, source: Source) -> Value:
    args = [wrap_lazy(state, a, ItemSource(AttrSource(source, "args"), i)) for i, a in enumerate(obj.args)]
    keywords = {k: wrap_lazy(state, v, ItemSource(AttrSource(source, "keywords"), k)) for k, v in obj.keywords.items()}
    value = PartialValue(wrap_lazy(state, obj.func, AttrSource(source, "func")), args, keywords)
    value.source = source
    return value


def guard_hasattr(state, source: Source | None, name: str, present: bool) -> None:
    """Capture relied on `hasattr(obj, name)` being `present` (a hasattr() call, or an AttributeError)."""
    if source is None:
        return
    expr = f"hasattr({state.source_expr(source)}, {name!r})"
    # no source of its own: the guard function would fetch `obj.name` first, which may not exist
    state.guards.add(Guard(GuardKind.HASATTR, None, f"{expr} is {present}", f"{expr} is {present}", expr))


def _is_typing_object(obj: Any) -> bool:
    return type(obj).__module__ == "typing" or isinstance(obj, (types.UnionType, types.GenericAlias))


def _is_fixed_object(key: Any) -> bool:
    """Dict keys that hash by identity and never change: classes, functions, enums, typing objects."""
    return isinstance(key, (type, types.FunctionType, types.BuiltinFunctionType, enum.Enum)) or _is_typing_object(key)


class _NamespaceRef:
    """A dict key kept in the guard namespace: its repr is the name an item source uses for it."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _key_ref(state, key: Any) -> Any:
    return key if is_literal(key) else _NamespaceRef(state.guards.constant(key, "key"))


def _is_torch_callable(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return callable(obj) and (module == "torch" or module.startswith("torch.") or module.startswith("torch._C")) and \
        not isinstance(obj, (torch.Tensor, nn.Module, type))


def _tensor(state, t: torch.Tensor, source: Source, expr: str) -> TensorValue:
    first = state.mutable_values.get(("tensor", id(t)), (None, source))[1]
    if first != source:
        # The same tensor as at `first`: its geometry is that source's, checked by that source's guard with its
        # symbolic sizes. A guard of its own here would pin this source's sizes and recompile on every new size
        # (automatic dynamic marks the first source's dimensions only); the identity guard is enough.
        return _tensor_input(state, t, source, expr)
    if is_traceable_wrapper_subclass(t):  # no storage of its own: a kernel cannot read it
        raise GraphBreak("unsupported_object", f"a {type(t).__name__} (a tensor subclass wrapping other tensors, "
                                               "e.g. an in-flight collective's result) runs natively")
    if t.is_neg():  # its memory holds the negated values: a kernel would read them as they lie
        raise GraphBreak("unsupported_object", "a tensor with a lazy negation (`z.conj().imag`, `x._neg_view()`) "
                                               "runs natively; `.resolve_neg()` makes it a plain tensor")
    sig = tensor_signature(t)
    dtype, device, shape, stride, requires_grad, cls = sig
    # the guard checks the sizes the graph was traced for: a fake made static before (the base of an input
    # `a[::2]` read first) stays static where dims were asked dynamic (3 rows traced ran on 4: fuzz seed 470191)
    asked = dynamic_dims(state, t, source)
    _, fake = state.graph.input(source, t, asked)
    dynamic = symbolic_dims(fake, asked)
    by_contiguity = t.is_contiguous() and min(shape, default=2) > 1
    names = [state.guards.constant(v, hint) for v, hint in ((cls, "type"), (dtype, "dtype"), (device, "device"))]
    check = f"type({expr}) is {names[0]} and {expr}.dtype is {names[1]} and {expr}.device == {names[2]} and " \
        f"not {expr}.is_neg() and "
    if dynamic:  # sizes are checked by the shape guard over the symbols; here only rank, static dims, layout
        static = " and ".join(f"{expr}.size({d}) == {n}" for d, n in enumerate(shape) if d not in dynamic)
        check += f"{expr}.dim() == {len(shape)} and {expr}.is_contiguous() and " + (f"{static} and " if static else "")
    elif by_contiguity:  # then the strides follow from the shape (and are a cheaper read than stride())
        check += f"{expr}.shape == {shape!r} and {expr}.is_contiguous() and "
    else:
        check += f"{expr}.shape == {shape!r} and {expr}.stride() == {stride!r} and "
    check += f"{expr}.requires_grad is {requires_grad}"
    described = describe_tensor(sig) + (f", dynamic dims {sorted(dynamic)}" if dynamic else "")
    native = None
    if not dynamic and cls in NATIVE_TYPES and t.layout == torch.strided:  # the same check, in C++
        native = (cls, dtype, device, shape, None if by_contiguity else stride, requires_grad)
    changed = f"___tensor_changes({state.guards.constant(sig, 'signature')}, {expr}, {tuple(sorted(dynamic))!r})"
    state.guards.add(Guard(GuardKind.TENSOR_MATCH, source, check, described,
                           f"___describe_tensor(___tensor_signature({expr}))", native, changed))
    return _tensor_input(state, t, source, expr, dynamic)


def _tensor_input(state, t: torch.Tensor, source: Source, expr: str, dynamic: frozenset = frozenset()) -> TensorValue:
    """The tracker of graph input `t` at `source` (one placeholder per tensor: a second source of it shares the
    first's, guarded to be the same object)."""
    node, fake = state.graph.input(source, t, dynamic)
    value = TensorValue(node, fake, source)
    value.real = t
    _guard_tensor_alias(state, t, source, expr)
    return value


def _guard_tensor_alias(state, t: torch.Tensor, source: Source, expr: str) -> None:
    """One tensor reached through two sources (tied weights): capture relied on it, so guard it."""
    first = state.mutable_values.setdefault(("tensor", id(t)), (None, source))[1]
    if first != source:
        first_expr = state.source_expr(first)
        state.guards.add(Guard(GuardKind.ID_MATCH, source, f"{expr} is {first_expr}",
                               f"the same tensor as {first_expr}", "'a different tensor'"))


def guard_input_aliasing(state) -> None:
    """If the graph writes a tensor input, guard which inputs share storage and at what offsets.

    A write through one input is read through every other on its storage (`f(x, x)`,
    `f(x, x[:3])`, a buffer passed in as an input too): the backend compiles for the aliasing of
    the inputs it was given, and a call with other aliasing must recompile (which inputs are written:
    `GraphBuilder.written_inputs`). Graphs that only read their inputs
    compute the same whatever aliases, and get no guard. Module state that is not written is left
    out: the guard reads every tensor it covers on each call, and parameters only alias when tied
    (the same object, which an identity guard already covers).
    """
    written = state.graph.written_inputs()
    inputs = [(source, real, writes) for (source, real), writes in zip(state.graph.inputs, written)
              if isinstance(real, torch.Tensor)]
    if not any(written for _, _, written in inputs):
        return
    covered = [(source, real) for source, real, written in inputs if written or not _is_state(source, real)]
    if len(covered) < 2:
        return
    exprs = [state.source_expr(source) for source, _ in covered]
    itemsizes = tuple(real.element_size() for _, real in covered)
    expected = input_aliasing(tuple(real for _, real in covered), itemsizes)
    shared = {j for j, _ in expected if sum(1 for k, _ in expected if k == j) > 1}
    described = "; ".join(" ".join(exprs[i] for i, (j, _) in enumerate(expected) if j == g) for g in sorted(shared))
    call = f"___input_aliasing(({', '.join(exprs)},), {itemsizes!r})"
    state.guards.add(Guard(GuardKind.INPUT_ALIASING, None, f"{call} == {state.guards.constant(expected, 'aliasing')}",
                           f"storage shared by {described}" if shared else "no two inputs share storage",
                           f"repr({call})"))


def _is_state(source: Source, t: torch.Tensor) -> bool:
    """A module's parameter or buffer (as `dynamic_dims` tells them)."""
    return isinstance(t, nn.Parameter) or getattr(source, "module_dict", None) in ("_parameters", "_buffers")


def dynamic_dims(state, t: torch.Tensor, source: Source) -> frozenset:
    """Which dimensions of an input get symbolic sizes: by `dynamic=`, automatic dynamic and marks.

    Parameters and buffers stay static (they do not change size between calls), as do sizes 0
    and 1 and non-contiguous inputs. Dimensions recorded for another rank (an input that was 2-d
    when its dimension 1 changed size, 1-d now) are left out: a new rank is a new specialization.
    """
    if _is_state(source, t):
        return frozenset()
    if state.dynamic is True:
        dims = set(range(t.dim()))
    elif state.dynamic is False:
        dims = set()
    else:
        dims = set(state.auto_dynamic.get(source, ()))
    marked_dynamic, marked_static = spellings.marked_dims(t)
    dims = (dims | marked_dynamic) - marked_static
    if not t.is_contiguous():
        return frozenset()
    return frozenset(d for d in dims if 0 <= d < t.dim() and t.shape[d] >= 2)


def _is_frame_input(state, source: Source, through_modules: bool = False) -> bool:
    """Whether `source` is an argument of the frame or reached from one (an item of a list argument, an
    attribute of an object passed in) without going through an nn.Module: the ints that automatic dynamic
    makes symbols once they change, as torch does. Ints of modules, globals and closures stay specialized:
    they are configuration, which a program does not vary between calls. `through_modules`: a float of a module
    passed in counts too, as torch.compile makes it an input once it changed (a layer's scale that differs
    between the instances of one layer class)."""
    while not isinstance(source, LocalSource):
        source = getattr(source, "base", None)
        if source is None or (source in state.module_sources and not through_modules):
            return False
    return through_modules or source not in state.module_sources


def is_symbolic_int(state, value: int, source: Source) -> bool:
    """Whether the int input at `source` is a symbol of the graph: with `dynamic=True` from the first call, with
    `dynamic=None` once its value changed between calls (automatic dynamic), never with `dynamic=False`. Ints
    outside int64 stay specialized: a symbol's value is an int64 in compiled code."""
    if state.dynamic is False or not -2**63 <= value < 2**63 or not _is_frame_input(state, source):
        return False
    return state.dynamic is True or ("scalar", source) in state.auto_dynamic


def _int_input(state, value: int, source: Source) -> SymValue:
    """An int input as a SymInt placeholder of the graph (`GraphBuilder.int_input`): every use of it, as a size,
    an index, a slice bound or an operand, stays symbolic, and the shape guard checks only the relations the
    graph relied on."""
    expr = state.source_expr(source)  # compiled code holds the symbol's value in an int64
    state.guards.add(Guard(GuardKind.TYPE_MATCH, source, f"-{2**63} <= {expr} < {2**63}", "an int64", expr))
    node, sym = state.graph.int_input(source, value)
    value = SymValue(node, sym)
    value.source = source
    return value


def _scalar_tensor_maker(state, obj: Any, source: Source):
    """For a float input whose value changed since the last capture (automatic dynamic): what makes it a graph
    input, a 0-d float64 tensor, when it meets a floating-point tensor in arithmetic (`x * s`), where a float
    promotes as a float64 0-d tensor does, so results keep eager's dtypes (`ScalarInputValue.graph_tensor`).
    None for any other number: an int that changed is a symbol instead (`_int_input`)."""
    if type(obj) is not float or ("scalar", source) not in state.auto_dynamic:
        return None

    def make() -> TensorValue:
        state.guards.namespace["___as_tensor"] = as_scalar_tensor
        tensor_source = ScalarTensorSource(source)
        return _tensor_input(state, as_scalar_tensor(obj), tensor_source, state.source_expr(tensor_source))

    return make


def size_float_tensor(state, value: SymValue) -> TensorValue:
    """The symbolic float `value` (`math.sqrt(n)` of a size n) as a 0-d float64 graph input the program computes
    from the call's sizes (`SizeFloatSource`): a kernel reads a tensor, where a float computed from sizes has no
    form in kiln's code generator."""
    reads = {}
    for symbol in value.sym.node.expr.free_symbols:
        source, dim = state.graph.symbol_sources[symbol]
        read = fast_expr(source) if dim is None else f"{fast_expr(source)}.size({dim})"
        reads[symbol] = sympy.Symbol(read)
    python = size_source(value.sym.node.expr.xreplace(reads))
    state.guards.namespace.update(SIZE_NAMES, ___as_tensor=as_scalar_tensor)  # names the printer writes
    source = SizeFloatSource(python)
    now = eval(python, dict(state.guards.namespace), {"L": state.L, "G": state.G, "C": state.C})
    return _tensor_input(state, as_scalar_tensor(now), source, source.expr())


def as_scalar_tensor(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64)


def _remember(state, obj: Any, source: Source, value: Value) -> Value:
    """Keep the one tracker of a mutable container, so a mutation through one path is seen by every path."""
    state.mutable_values[id(obj)] = (value, source)
    return value


def _alias(state, obj: Any, source: Source, expr: str) -> Value:
    """A list or dict already wrapped from another source: the same tracker, guarded to stay the same object."""
    value, first = state.mutable_values[id(obj)]
    if first != source:
        first_expr = state.source_expr(first)
        state.guards.add(Guard(GuardKind.ID_MATCH, source, f"{expr} is {first_expr}",
                               f"the same object as {first_expr}",
                               f"'a different object: ' + repr(type({expr}).__name__)"))
    return value


def _function_guard(state, fn: types.FunctionType, source: Source, expr: str) -> None:
    """A function defined inside another is a new object on every call: guard its code, not its identity.

    Its defaults and closure cells are read through their sources, guarded when used.
    """
    if "<locals>" not in fn.__qualname__ or spellings.is_disabled(fn) or getattr(fn, "__wrapped__", None):
        guard_identity(state, fn, source, expr)
        return
    code = state.guards.constant(fn.__code__, "code")
    glob = state.guards.constant(fn.__globals__, "globals")
    state.guards.add(Guard(GuardKind.ID_MATCH, source,
                           f"type({expr}) is ___function_type and {expr}.__code__ is {code} "
                           f"and {expr}.__globals__ is {glob}",
                           f"a function with the code of {fn.__qualname__}", f"repr({expr})"))
    state.guards.namespace["___function_type"] = types.FunctionType


def guard_identity(state, obj: Any, source: Source, expr: str) -> None:
    """Capture relied on the object at `source` (read as `expr`) being `obj` itself."""
    name = state.guards.constant(obj, "obj")
    label = _label(obj)
    state.guards.add(Guard(GuardKind.ID_MATCH, source, f"{expr} is {name}", f"the same object ({label})",
                           f"'a different object: ' + repr(type({expr}).__name__)"))


def _label(obj: Any) -> str:
    """A readable name for an identity guard: a class's or function's qualified name, else its type's name.
    Read defensively: module-like objects answer any attribute (torch.classes makes a namespace of it, whose
    repr raises RuntimeError)."""
    try:
        qualname = getattr(obj, "__qualname__", None)
    except Exception:
        qualname = None
    return qualname if isinstance(qualname, str) else type(obj).__name__


def _type(state, obj: Any, source: Source, expr: str) -> None:
    state.guards.add(Guard(GuardKind.TYPE_MATCH, source, f"type({expr}) is {_type_name(state, obj)}",
                           type(obj).__name__, f"type({expr}).__name__"))


def _type_name(state, obj: Any) -> str:
    cls = type(obj)
    if cls in (int, float, str, bytes, bool, tuple, list, dict):
        return cls.__name__
    return state.guards.constant(cls, "type")
