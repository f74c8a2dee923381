"""`MyFunction.apply(...)` for a custom torch.autograd.Function: one graph node, as torch.compile makes one.

torch.compile traces the forward and backward into a higher-order op. kiln records the call itself: the node
calls `MyFunction.apply` when the graph runs, so the engine sees the user's own Function (its backward, its
saved tensors, `once_differentiable`, `mark_non_differentiable`) exactly as in eager, and kiln's AOT stage
traces through both methods like any other code. The output's metadata comes from running `apply` on the
fake inputs during capture; a forward that cannot run on fake tensors (it reads values) is a graph break,
and the call then runs natively.
"""
from __future__ import annotations

import torch

from kiln.capture.values.base import Value
from kiln.capture.values.classes import guard_class_entry, mro_entry
from kiln.capture.values.tensor import trace_op

_APPLY = torch.autograd.Function.apply.__func__


def is_function_apply(cls: type, attr) -> bool:
    """Whether `cls.<attr>` is the `apply` every custom autograd.Function inherits."""
    return isinstance(attr, classmethod) and attr.__func__ is _APPLY and issubclass(cls, torch.autograd.Function)


class FunctionApplyValue(Value):
    """`cls.apply`, bound to the custom Function class `cls`."""

    def __init__(self, cls: type, class_value: Value):
        self.cls, self.class_value = cls, class_value
        self.obj, self.source = cls.apply, None

    def python_type(self) -> type:
        return type(self.obj)

    def call(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        for name in ("forward", "backward", "setup_context", "vjp", "jvp"):  # what the recorded node relies on
            guard_class_entry(state, self.cls, name, mro_entry(self.cls, name), self.class_value.source)
        return trace_op(state, "call_function", self.cls.apply, args, kwargs)

    def reconstruct(self, writer) -> str:
        return f"{writer.value(self.class_value)}.apply"

    def __repr__(self) -> str:
        return f"FunctionApply({self.cls.__qualname__})"
