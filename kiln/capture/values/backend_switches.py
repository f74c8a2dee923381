"""torch's process-wide switches during capture: cuDNN's and oneDNN's flags, the fp32 precision of a backend,
the deterministic-algorithms mode.

`torch.backends.cudnn.flags(enabled=False)` (transformers' CTC loss) and managers of a user's own that set
`torch.backends.cudnn.benchmark` or call `torch.use_deterministic_algorithms` change process-wide switches
through getter/setter pairs of `torch._C`, reached through `torch.backends`' Python (its `flags` managers, the
`ContextProp` descriptors of its module objects). kiln models the pairs themselves, so all of that Python is
traced as written:

- a read is a value of the capture: the switch's value when the call began, guarded, or what traced code
  wrote to it earlier in the capture;
- a write is an effect the output program replays after the graph, in order with the other effects, and the
  switch's value when the call began is guarded too: a manager that sets and restores a switch leaves it as
  eager does, also when its block raises (its `finally` is traced like any other);
- the graph's ops run under the switches as they were when the call began. So while a switch differs from
  that value, an op on a device the switch governs (a CUDA op while `cudnn.enabled` is off) ends the graph
  before it: that op then runs natively, under the switch as eager runs it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.capture.breaks import GraphBreak
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue


@dataclass(frozen=True)
class Switch:
    """One switch: `torch._C.<getter>(*args)` reads it; the ops of `devices` (device types, None: every
    device) read it."""

    getter: str
    devices: frozenset[str] | None

    @property
    def linked(self) -> str | None:
        """The group of switches this one is a view of, with them (LINKED)."""
        return LINKED.get(self.getter)


CUDA, CPU, XPU = frozenset({"cuda"}), frozenset({"cpu"}), frozenset({"xpu"})

# Switches with a setter of their own, `torch._C.<setter>(*args, value)`, by getter and setter.
_PAIRS = [
    ("_get_cudnn_enabled", "_set_cudnn_enabled", CUDA),
    ("_get_cudnn_benchmark", "_set_cudnn_benchmark", CUDA),
    ("_get_cudnn_deterministic", "_set_cudnn_deterministic", CUDA),
    ("_get_cudnn_allow_tf32", "_set_cudnn_allow_tf32", CUDA),
    ("_get_cudnn_depthwise_kernel", "_set_cudnn_depthwise_kernel", CUDA),
    ("_cuda_get_cudnn_benchmark_limit", "_cuda_set_cudnn_benchmark_limit", CUDA),
    ("_get_mkldnn_enabled", "_set_mkldnn_enabled", CPU),
    ("_get_mkldnn_deterministic", "_set_mkldnn_deterministic", CPU),
    ("_get_onednn_allow_tf32", "_set_onednn_allow_tf32", XPU),  # oneDNN's TF32 runs on Intel GPUs only
    # (backend, op) name the switch: backend "cuda" governs CUDA ops, "mkldnn" CPU ops, "generic" both
    ("_get_fp32_precision_getter", "_set_fp32_precision_setter", CUDA | CPU),
]
_PRESENT = [(g, s, d) for g, s, d in _PAIRS if hasattr(torch._C, g) and hasattr(torch._C, s)]

# Switches that are views of one state: cuDNN's and oneDNN's TF32 flags read and set the fp32 precision of the
# ops they name (`cudnn.allow_tf32 = False` sets the precision of ("cuda", "conv") and ("cuda", "rnn")). A
# write that changes one of them leaves the others to torch's rules, which kiln does not model: until traced
# code writes them, their values are unknown, a read of one is a break, and ops on any device break.
LINKED = {"_get_cudnn_allow_tf32": "tf32", "_get_fp32_precision_getter": "tf32", "_get_onednn_allow_tf32": "tf32"}

# `torch.use_deterministic_algorithms(mode, warn_only=...)` sets two switches at once; any op may have a
# deterministic variant. Its Python function is modelled as it is (it also writes inductor's config, which the
# replayed call writes as eager's does).
DETERMINISTIC = Switch("_get_deterministic_algorithms", None)
DETERMINISTIC_WARN_ONLY = Switch("_get_deterministic_algorithms_warn_only", None)


def _pair_writes(switch: Switch):
    return lambda args, kwargs: [(switch, args[:-1], args[-1])]


def _deterministic_writes(args: tuple, kwargs: dict) -> list:
    warn_only = kwargs.get("warn_only", args[1] if len(args) > 1 else False)
    return [(DETERMINISTIC, (), args[0]), (DETERMINISTIC_WARN_ONLY, (), warn_only)]


# function -> the switch it reads; function -> what a call writes: [(switch, its arguments, value)]
READS: dict[Any, Switch] = {getattr(torch._C, g): Switch(g, d) for g, _, d in _PRESENT}
READS.update({torch._C._get_deterministic_algorithms: DETERMINISTIC,
              torch.are_deterministic_algorithms_enabled: DETERMINISTIC,
              torch._C._get_deterministic_algorithms_warn_only: DETERMINISTIC_WARN_ONLY,
              torch.is_deterministic_algorithms_warn_only_enabled: DETERMINISTIC_WARN_ONLY})
WRITES: dict[Any, Callable] = {getattr(torch._C, s): _pair_writes(Switch(g, d)) for g, s, d in _PRESENT}
WRITES.update({torch._C._set_deterministic_algorithms: _deterministic_writes,
               torch.use_deterministic_algorithms: _deterministic_writes})
_BACKEND_DEVICES = {"cuda": CUDA, "mkldnn": CPU}


def is_switch_call(fn: Any) -> bool:
    try:
        return fn in READS or fn in WRITES
    except TypeError:  # an unhashable callable
        return False


def call_switch(state, fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """A read or a write of switches in traced code: `torch._C.<getter>(*args)`, `torch._C.<setter>(*args,
    value)`, `torch.use_deterministic_algorithms(mode, warn_only=...)`."""
    if not all(a.is_constant() for a in [*args, *kwargs.values()]):
        raise GraphBreak("unsupported_call", f"{fn.__name__} with arguments that are not constants")
    values = tuple(a.as_constant() for a in args)
    if fn in READS:
        return ConstantValue(state.switches.read(state, READS[fn], values))
    for switch, key, value in WRITES[fn](values, {k: v.as_constant() for k, v in kwargs.items()}):
        state.switches.write(state, switch, key, value)
    state.side_effects.deferred_call(ConstantValue(fn), list(args), dict(kwargs))
    return ConstantValue(None)


@dataclass
class Switches:
    """The switches traced code read or wrote in this capture: (switch, args) -> value at entry, and now; for a
    group of linked switches one of which a write changed, the ones written since (the others are unknown)."""

    entry: dict[tuple, Any] = field(default_factory=dict)
    now: dict[tuple, Any] = field(default_factory=dict)
    known_in: dict[str, set] = field(default_factory=dict)

    def read(self, state, switch: Switch, args: tuple) -> Any:
        key = (switch, args)
        if not self._known(key):
            raise GraphBreak("unsupported_call", f"torch._C.{switch.getter}{args!r} read after a switch linked to "
                             "it changed")
        return self.now[key] if key in self.now else self._entry_value(state, key)

    def write(self, state, switch: Switch, args: tuple, value: Any) -> None:
        key = (switch, args)
        self._entry_value(state, key)  # the ops after the write are checked against it (`check_op`)
        group = switch.linked
        if group is not None:
            current = self.now.get(key, self.entry[key])
            if not self._known(key) or current != value:  # a change: torch updates the group's other views
                self.known_in[group] = set()
            if group in self.known_in:
                self.known_in[group].add(key)
        self.now[key] = value

    def _known(self, key: tuple) -> bool:
        group = key[0].linked
        return group not in self.known_in or key in self.known_in[group]

    def _entry_value(self, state, key: tuple) -> Any:
        """The switch's value when the call began (no traced write has reached the process yet), guarded."""
        if key not in self.entry:
            switch, args = key
            value = getattr(torch._C, switch.getter)(*args)
            self.entry[key] = value
            call = f"torch._C.{switch.getter}({', '.join(map(repr, args))})"
            state.guards.add(Guard(GuardKind.BACKEND_SWITCH, None, f"{call} == {value!r}", f"{call} == {value!r}",
                                   call))
        return self.entry[key]

    def changed(self) -> list[tuple[str, frozenset[str] | None]]:
        """What differs from the state the call began with, at this point of the capture, and the device types
        whose ops it governs (None: every device): the switches written to another value, the linked groups
        whose other views are unknown."""
        changed = [(f"torch._C.{switch.getter}{args!r}", _devices(switch, args))
                   for (switch, args), value in self.now.items() if value != self.entry[(switch, args)]]
        return changed + [(f"the {group} switches", None) for group in self.known_in]

    def check_op(self, target: Any, fake_args: tuple, fake_kwargs: dict) -> None:
        """Break before an op that a switch changed in this capture governs (see the module's docstring)."""
        if not self.now:
            return
        op_devices = _op_devices(fake_args, fake_kwargs)
        for what, governed in self.changed():
            if op_devices and (governed is None or governed & op_devices):
                name = getattr(target, "__name__", str(target))
                raise GraphBreak("backend_switch", f"{name} on {'/'.join(sorted(op_devices))} while {what} "
                                 "differs from its value at the call")


def _devices(switch: Switch, args: tuple) -> frozenset[str] | None:
    if switch.getter == "_get_fp32_precision_getter" and args:
        return _BACKEND_DEVICES.get(args[0], switch.devices)
    return switch.devices


def _op_devices(fake_args: tuple, fake_kwargs: dict) -> frozenset[str]:
    """The device types an op reads tensors on or makes them on (its `device=`). An op with neither (a factory
    on the default device) stays in the graph: a switch changes nothing it computes but uninitialized memory."""
    devices = {leaf.device.type for leaf in torch.utils._pytree.tree_leaves((fake_args, fake_kwargs))
               if isinstance(leaf, torch.Tensor)}
    device = fake_kwargs.get("device")
    if device is not None:
        devices.add(torch.device(device).type)
    return frozenset(devices)
