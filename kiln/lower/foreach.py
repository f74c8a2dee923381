"""`torch._foreach_*` ops as loops of their per-tensor ops.

Graphs meet them through torch code written for compilers: an optimizer step, clip_grad_norm_. An
optimizer's foreach implementation is the one that supports a tensor learning rate under a compiler
(so a scheduler's new value is an input, not a recompile); kiln's lowering knows the per-tensor ops, and
fuses each parameter's update into one kernel. Every overload of every `aten._foreach_*` op is handled by
one rule: list arguments are zipped, scalar-list arguments indexed, anything else passed to each call.
"""
from __future__ import annotations

from collections.abc import Callable

import torch


def _per_tensor_op(foreach_name: str) -> Callable:
    """`_foreach_add_` -> `aten.add_`, `_foreach_lerp` -> `aten.lerp` (the overload picked per call)."""
    return getattr(torch.ops.aten, foreach_name[len("_foreach_"):])


def _decomposition(op: Callable, in_place: bool) -> Callable:
    positional, keyword_only = _signature(op)

    def loop(*args, **kwargs):
        length = next(len(a) for a in args if isinstance(a, (list, tuple)))
        results = []
        for i in range(length):
            items = [a[i] if isinstance(a, (list, tuple)) else a for a in args]
            # a foreach op passes positionally what its per-tensor op takes by keyword (`value`, `alpha`)
            named = dict(zip(keyword_only, items[positional:]))
            named.update({k: v[i] if isinstance(v, (list, tuple)) else v for k, v in kwargs.items()})
            results.append(op(*items[:positional], **named))
        return None if in_place else results
    return loop


def _signature(op: Callable) -> tuple[int, list[str]]:
    """How many arguments the per-tensor op takes positionally, and its keyword-only names, in order."""
    schemas = [getattr(op, name)._schema for name in op.overloads()]
    widest = max(schemas, key=lambda s: len(s.arguments))
    positional = max(sum(not a.kwarg_only for a in s.arguments) for s in schemas)
    return positional, [a.name for a in widest.arguments if a.kwarg_only and a.name != "out"]


def _table() -> dict:
    table = {}
    for qualified in torch._C._dispatch_get_all_op_names():
        if not qualified.startswith("aten::_foreach_"):
            continue
        name, _, overload = qualified[len("aten::"):].partition(".")
        if overload.endswith("out") or not hasattr(torch.ops.aten, name[len("_foreach_"):]):
            continue  # no per-tensor twin: left to the backend
        op = getattr(getattr(torch.ops.aten, name), overload or "default")
        table[op] = _decomposition(_per_tensor_op(name), name.endswith("_"))
    return table


FOREACH_DECOMPOSITIONS = _table()
