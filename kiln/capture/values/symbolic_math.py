"""`math` on symbolic numbers: graph nodes over SymInts and SymFloats, as under torch.compile.

`math.ceil(n / 2)` of a dynamic size `n` is `CeilToInt(IntTrueDiv(n, 2))`, one graph for every size, where
folding it would read `n`'s value and guard it (a recompile per size). Rounding goes through the SymFloat's own
`__ceil__` / `__floor__` / `__trunc__` / `__round__`; `sqrt`, `log2` and the trigonometric functions through
torch's `_sym_<name>` functions, as torch.compile maps them.
"""
from __future__ import annotations

import builtins
import math
from collections.abc import Callable

import torch

from kiln.capture.breaks import GraphBreak
from kiln.capture.values.base import Value
from kiln.capture.values.symbolic import SymValue
from kiln.capture.values.tensor import trace_op

ROUNDING = (math.ceil, math.floor, math.trunc, builtins.round)
SYMBOLIC_MATH: dict[Callable, Callable] = {**{fn: fn for fn in ROUNDING}, **{
    getattr(math, name): getattr(torch, f"_sym_{name}") for name in (
        "sqrt", "cos", "cosh", "sin", "sinh", "tan", "tanh", "asin", "acos", "atan", "log2")
    if hasattr(torch, f"_sym_{name}")}}


def symbolic_math(state, fn: Callable, values: list[Value]) -> Value | None:
    """`fn(*values)` as a graph node when a value is symbolic and the others are numbers; None where Python
    computes it from the values themselves (no symbol among them, or the fake run raised: a domain error)."""
    if not any(isinstance(v, SymValue) for v in values) or not all(
            isinstance(v, SymValue) or (v.is_constant() and type(v.as_constant()) in (int, float)) for v in values):
        return None
    if fn in ROUNDING and values[0].python_type() is int and (len(values) == 1 or fn is not builtins.round):
        return values[0]  # an int rounds to itself
    try:
        return trace_op(state, "call_function", SYMBOLIC_MATH[fn], values, {})
    except GraphBreak as e:
        if e.reason.id != "exception":
            raise
        return None
