"""nn.Modules during capture: forward inlined, parameters and buffers as graph inputs.

A module is guarded by its class, not its identity (builder._module), as torch.compile inlines modules:
everything capture reads of it is guarded where it is read, so one entry serves every instance that
matches. Calling it inlines `type(m).forward` after a guard that it has no hooks; its parameters and
buffers are read by attribute source (`L['self'].fc1.weight`) and become graph inputs with tensor guards;
`self.training` is guarded by value; a container's member names are guarded. Plain attributes are guarded
by value on every module, torch.nn's own too: `model.dropout.p = 0.0` after compiling must recompile
(torch.compile does), not keep the old probability.
"""
from __future__ import annotations

from torch import nn
from torch.nn.modules import module as _module_module

try:
    from torch.distributed.fsdp import FSDPModule
except ImportError:  # a torch built without torch.distributed
    FSDPModule = None

from kiln.capture.breaks import GraphBreak
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.side_effects import is_deleted
from kiln.capture.sources import AttrSource
from kiln.capture.values.base import Value
from kiln.capture.values.classes import class_attribute, guard_not_shadowed
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.containers import TupleValue
from kiln.capture.values.dicts import DictValue
from kiln.capture.values.exceptions import raise_python

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


# Module types whose hooks kiln never inlines: FSDP2's (`fully_shard`) all-gather parameters, swap them into the
# module and reduce-scatter gradients on torch.distributed's own streams and state. A call of such a module
# breaks the graph and runs its hooks natively around its compiled forward (capture/entry.py, call_nested).
_NATIVELY_HOOKED: tuple[type, ...] = () if FSDPModule is None else (FSDPModule,)


def hooks_run_natively(m) -> bool:
    """Whether `m`'s hooks are ones kiln never inlines (FSDP2's): they run natively around its compiled forward."""
    return isinstance(m, _NATIVELY_HOOKED)


def any_global_hooks() -> bool:
    """Whether any global module hook is registered (called by guards on every call: keep it cheap)."""
    m = _module_module
    return bool(m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
                or getattr(m, "_global_backward_pre_hooks", None))


class ModuleValue(Value):
    def __init__(self, module: nn.Module, source):
        self.module, self.obj, self.source = module, module, source

    def python_type(self) -> type:
        return type(self.module)

    # --- attributes -------------------------------------------------------------------------
    def getattr(self, state, name: str) -> Value:
        pending = state.side_effects.pending_attr(self.module, name)
        if pending is not None and is_deleted(pending):
            raise GraphBreak("unsupported_object", f"{type(self.module).__name__}.{name} read after `del`")
        if pending is not None:
            return pending
        m, source = self.module, AttrSource(self.source, name)
        d = m.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if name in d.get(table, {}) and name not in d:
                return state.wrap(d[table][name], AttrSource(self.source, name, table))
        if name in d:
            value = d[name]
            return state.wrap(value, source)  # guarded by value, torch.nn's own modules too (dropout.p, eps)
        if name == "__class__":
            return state.wrap_unsourced(type(m))  # a ClassValue
        guard_not_shadowed(state, self, name)
        return class_attribute(state, self, type(m), name, source)

    def setattr(self, state, name: str, value: Value) -> None:
        state.module_written(self.module, self.source)
        state.side_effects.store_attr(self.module, self, name, value)

    def delattr(self, state, name: str) -> None:
        state.module_written(self.module, self.source)
        state.side_effects.del_attr(self.module, self, name)  # nn.Module.__delattr__ runs on replay

    # --- calls --------------------------------------------------------------------------------
    def call(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        m = self.module
        if isinstance(m, _NATIVELY_HOOKED):
            raise GraphBreak("distributed_hooks", f"{type(m).__name__}: its fully_shard hooks run natively")
        if m._backward_hooks or m._backward_pre_hooks or any_global_hooks():
            raise GraphBreak("hooks", f"{type(m).__name__} has backward or global hooks registered")
        expr = state.source_expr(self.source)
        if m._forward_hooks or m._forward_pre_hooks:
            state.guards.add(Guard(GuardKind.NO_HOOKS, self.source,
                                   f"not ({expr}._backward_hooks or {expr}._backward_pre_hooks)", "no backward hooks",
                                   f"dict({expr}._backward_hooks, **{expr}._backward_pre_hooks)"))
            return self._call_with_forward_hooks(state, args, kwargs)
        # backward hooks too: one registered after compiling must still fire (the call then breaks)
        state.guards.add(Guard(GuardKind.NO_HOOKS, self.source,
                               f"not ({expr}._forward_hooks or {expr}._forward_pre_hooks or {expr}._backward_hooks "
                               f"or {expr}._backward_pre_hooks)", "no hooks",
                               f"dict({expr}._forward_hooks, **{expr}._forward_pre_hooks)"))
        state.guards.namespace["___global_hooks"] = any_global_hooks  # a global hook registered later must run
        state.guards.add(Guard(GuardKind.NO_HOOKS, None, "not ___global_hooks()", "no global module hooks",
                               "___global_hooks()"))
        forward = self.getattr(state, "forward")
        return forward.call(state, args, kwargs)

    def _call_with_forward_hooks(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """`Module.__call__` with forward (pre-)hooks, as torch runs them: each hook is inlined like any
        function. The hook dicts are read through their sources, so adding or removing a hook recompiles."""
        def hooks(name: str) -> list[tuple[Value, bool]]:
            table = self.getattr(state, name).realize()
            with_kwargs = self.getattr(state, name + "_with_kwargs").realize()
            if not isinstance(table, DictValue) or not isinstance(with_kwargs, DictValue):
                raise GraphBreak("hooks", f"{type(self.module).__name__}.{name} is not a plain dict")
            return [(hook, key in with_kwargs.items) for key, hook in table.items.items()]

        for hook, takes_kwargs in hooks("_forward_pre_hooks"):
            if takes_kwargs:
                result = hook.call(state, [self, TupleValue(args), DictValue(kwargs)], {})
                if not _is_none(result):
                    new_args, new_kwargs = result.unpack(state)
                    args, kwargs = new_args.unpack(state), dict(new_kwargs.realize().items)
            else:
                result = hook.call(state, [self, TupleValue(args)], {})
                if not _is_none(result):
                    args = result.unpack(state) if issubclass(result.python_type(), tuple) else [result]
        output = self.getattr(state, "forward").call(state, args, kwargs)
        for hook, takes_kwargs in hooks("_forward_hooks"):
            hook_args = ([self, TupleValue(args), DictValue(kwargs), output] if takes_kwargs
                         else [self, TupleValue(args), output])
            result = hook.call(state, hook_args, {})
            if not _is_none(result):
                output = result
        return output

    def call_method(self, state, name, args, kwargs) -> Value:
        raise GraphBreak("unsupported_call", f"nn.Module.{name}")

    # --- containers -------------------------------------------------------------------------
    def unpack(self, state) -> list[Value]:
        m = self.module
        if not isinstance(m, _CONTAINERS):
            raise GraphBreak("unsupported_object", f"iterating over {type(m).__name__}")
        self._guard_length(state)
        if isinstance(m, (nn.ModuleDict, nn.ParameterDict)):
            return [ConstantValue(k) for k in m.keys()]
        return [self.getattr(state, k) for k in self._keys()]

    def _table(self) -> str:
        """The dict of the members a container iterates: its parameters, or its modules."""
        return "_parameters" if isinstance(self.module, (nn.ParameterList, nn.ParameterDict)) else "_modules"

    def _keys(self) -> list[str]:
        return list(getattr(self.module, self._table()).keys())

    def _guard_length(self, state) -> None:
        """The container's member names, in order (which imply its length): another container of the class, or
        this one changed, with other names (a ModuleDict's keys, a Sequential's named layers) recompiles."""
        expr, keys = state.source_expr(self.source), self._keys()
        table = f"list({expr}.{self._table()})"
        state.guards.add(Guard(GuardKind.DICT_KEYS, self.source, f"{table} == {keys!r}", repr(keys), table))

    def truth(self, state) -> bool:
        """`if self.downsample:` — a module is true unless its class defines __bool__ or __len__ (containers)."""
        cls = type(self.module)
        if getattr(cls, "__bool__", None) is not None:
            return self.getattr(state, "__bool__").call(state, [], {}).truth(state)
        if getattr(cls, "__len__", None) is not None:
            return self.length(state) > 0
        return True

    def length(self, state) -> int:
        self._guard_length(state)
        return len(self.module)

    def getitem(self, state, key: Value) -> Value:
        m = self.module
        k = key.as_constant()
        if isinstance(m, (nn.ModuleDict, nn.ParameterDict)):
            return self.getattr(state, k)
        self._guard_length(state)
        return _item_of(state, self, self._keys(), k)

    def reconstruct(self, writer) -> str:
        return writer.source_expr(self.source)

    def __repr__(self) -> str:
        return f"Module({type(self.module).__name__} at {self.source})"


def _item_of(state, container: Value, keys: list[str], index) -> Value:
    """`container[index]` of a ModuleList, Sequential or ParameterList: one member, or a slice of them
    (a new container of the same kind in eager, callable when it is a Sequential)."""
    if isinstance(index, slice):
        return ModuleSliceValue(container, keys[index], index)
    if not isinstance(index, int):
        raise raise_python(TypeError, f"{container.python_type().__name__} indices must be integers or slices")
    if not -len(keys) <= index < len(keys):
        raise raise_python(IndexError, f"index {index} is out of range")
    return container.getattr(state, keys[index])


class ModuleSliceValue(Value):
    """`seq[1:]` of a ModuleList, Sequential or ParameterList: the members named `keys`, in order.

    Eager builds a new container of the parent's class holding the same members; this value stands for it:
    it iterates, indexes, slices and (a Sequential) calls as that container would. Rebuilt natively as the
    same slice of the parent.
    """

    def __init__(self, parent: Value, keys: list[str], index: slice):
        self.parent, self.keys, self.index = parent, keys, index
        self.source = None

    def python_type(self) -> type:
        return self.parent.python_type()

    def unpack(self, state) -> list[Value]:
        return [self.parent.getattr(state, k) for k in self.keys]

    def length(self, state) -> int:
        return len(self.keys)

    def truth(self, state) -> bool:
        return bool(self.keys)

    def getitem(self, state, key: Value) -> Value:
        index = key.as_constant()
        if isinstance(index, slice):
            return ModuleSliceValue(self, self.keys[index], index)
        return _item_of(state, self, self.keys, index)

    def getattr(self, state, name: str) -> Value:
        return self.parent.getattr(state, name)  # members by name; the slice shares them with its parent

    def call(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        """A Sequential slice chains its members (nn.Sequential.forward); other containers are not callable."""
        cls = self.python_type()
        if not issubclass(cls, nn.Sequential) or cls.forward is not nn.Sequential.forward:
            raise GraphBreak("unsupported_call", f"calling a slice of {cls.__name__}")
        if len(args) != 1 or kwargs:
            raise GraphBreak("unsupported_call", "a Sequential called with other than one argument")
        value = args[0]
        for member in self.unpack(state):
            value = member.call(state, [value], {})
        return value

    def reconstruct(self, writer) -> str:
        return f"{writer.value(self.parent)}[{writer.constant(self.index)}]"

    def __repr__(self) -> str:
        return f"ModuleSlice({self.parent!r}[{self.index}])"


def _is_none(value: Value) -> bool:
    value = value.realize()
    return value.is_constant() and value.as_constant() is None
