"""torch's backend switches during capture: cuDNN's and oneDNN's flags and the fp32 precision of a backend.

`torch.backends.cudnn.flags(enabled=False)` (transformers' CTC loss) and managers of a user's own that set
`torch.backends.cudnn.benchmark` change process-wide switches through getter/setter pairs of `torch._C`,
reached through `torch.backends`' Python (its `flags` managers, the `ContextProp` descriptors of its module
objects). kiln models the pairs themselves, so all of that Python is traced as written:

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

from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.capture.breaks import GraphBreak
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue


@dataclass(frozen=True)
class Switch:
    """One switch: `torch._C.<getter>(*args)` reads it, `torch._C.<setter>(*args, value)` writes it; the ops
    of `devices` (device types) read it."""

    getter: str
    setter: str
    devices: frozenset[str]


CUDA, CPU, XPU = frozenset({"cuda"}), frozenset({"cpu"}), frozenset({"xpu"})

# The switches by their getter, then by their setter (both C functions of torch._C).
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
SWITCHES = [Switch(g, s, d) for g, s, d in _PAIRS if hasattr(torch._C, g) and hasattr(torch._C, s)]
BY_GETTER = {getattr(torch._C, s.getter): s for s in SWITCHES}
BY_SETTER = {getattr(torch._C, s.setter): s for s in SWITCHES}
_BACKEND_DEVICES = {"cuda": CUDA, "mkldnn": CPU}


def is_switch_call(fn: Any) -> bool:
    try:
        return fn in BY_GETTER or fn in BY_SETTER
    except TypeError:  # an unhashable callable
        return False


def call_switch(state, fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    """`torch._C.<getter>(*args)` or `torch._C.<setter>(*args, value)` in traced code."""
    if kwargs or not all(a.is_constant() for a in args):
        raise GraphBreak("unsupported_call", f"{fn.__name__} with arguments that are not constants")
    values = tuple(a.as_constant() for a in args)
    if fn in BY_GETTER:
        return ConstantValue(state.switches.read(state, BY_GETTER[fn], values))
    state.switches.write(state, BY_SETTER[fn], values[:-1], values[-1])
    state.side_effects.deferred_call(ConstantValue(fn), [ConstantValue(v) for v in values], {})
    return ConstantValue(None)


@dataclass
class Switches:
    """The switches traced code read or wrote in this capture: (switch, args) -> value at entry, and now."""

    entry: dict[tuple, Any] = field(default_factory=dict)
    now: dict[tuple, Any] = field(default_factory=dict)

    def read(self, state, switch: Switch, args: tuple) -> Any:
        key = (switch, args)
        return self.now[key] if key in self.now else self._entry_value(state, key)

    def write(self, state, switch: Switch, args: tuple, value: Any) -> None:
        key = (switch, args)
        self._entry_value(state, key)  # the ops after the write are checked against it (`check_op`)
        self.now[key] = value

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

    def changed_devices(self) -> frozenset[str]:
        """The device types whose ops would run under another switch value than eager's at this point."""
        devices = frozenset()
        for key, value in self.now.items():
            if value != self.entry[key]:
                devices |= _devices(*key)
        return devices

    def check_op(self, target: Any, fake_args: tuple, fake_kwargs: dict) -> None:
        """Break before an op that a switch changed in this capture governs (see the module's docstring)."""
        if not self.now:
            return
        changed = self.changed_devices()
        if changed & _op_devices(fake_args, fake_kwargs):
            name = getattr(target, "__name__", str(target))
            raise GraphBreak("backend_switch", f"{name} on {'/'.join(sorted(changed))} while a torch.backends "
                             "switch differs from its value at the call")


def _devices(switch: Switch, args: tuple) -> frozenset[str]:
    if switch.getter == "_get_fp32_precision_getter" and args:
        return _BACKEND_DEVICES.get(args[0], switch.devices)
    return switch.devices


def _op_devices(fake_args: tuple, fake_kwargs: dict) -> frozenset[str]:
    """The device types an op reads tensors on or makes them on (its `device=`). A factory without `device=`
    makes them on the default device, where no switch changes what it computes."""
    devices = {leaf.device.type for leaf in torch.utils._pytree.tree_leaves((fake_args, fake_kwargs))
               if isinstance(leaf, torch.Tensor)}
    device = fake_kwargs.get("device")
    if device is not None:
        devices.add(torch.device(device).type)
    return frozenset(devices)
