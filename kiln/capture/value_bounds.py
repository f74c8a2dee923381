"""Branches a capture can decide without a tensor's data: a uniform draw compared with a constant outside its range.

Hugging Face's encoder-decoders skip a layer at random in training (`if torch.rand([]) < self.layerdrop:`), and
their configurations leave `layerdrop` at 0.0: the draw is never below it, yet the branch reads a tensor's value, so
kiln (and torch.compile) broke the graph at every layer, eight graph breaks per BART or Whisper training step.

A draw of `torch.rand` / `torch.rand_like` lies in [0, 1) (taken as [0, 1] here, so that a draw rounded up to 1 in
a low-precision dtype changes nothing). Compared with a Python number outside that range (`< c` with c <= 0, `> c`
with c >= 1, and so on) the result is the same for every draw, and `if` on it takes that branch with no graph
break. The draw itself stays in the graph, so the random stream advances as in eager; the constant is guarded as
every constant the capture reads (a layerdrop changed later recompiles). Nothing else is decided here.
"""
from __future__ import annotations

import math
import operator

import torch

# ops whose every element lies in [0, 1]
UNIFORM_DRAWS = {torch.rand, torch.rand_like}

# the comparison each target makes (an operator, a torch function, a tensor method)
COMPARISONS = {operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=", torch.lt: "<", torch.le: "<=",
               torch.gt: ">", torch.ge: ">=", "__lt__": "<", "__le__": "<=", "__gt__": ">", "__ge__": ">=", "lt": "<",
               "le": "<=", "gt": ">", "ge": ">="}
_REFLECTED = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}  # `c < t` is `t > c`


def bounds_of(target, result: torch.Tensor) -> tuple[float, float] | None:
    """The closed range every element of `target`'s floating-point result lies in, where the op fixes one."""
    if target in UNIFORM_DRAWS and result.is_floating_point():
        return 0.0, 1.0
    return None


def known_comparison(target, tensor_first: bool, bounds: tuple[float, float], constant) -> bool | None:
    """The value of every element of `tensor <op> constant` (`constant <op> tensor` where not `tensor_first`) for a
    tensor whose elements lie in `bounds`, where the range decides it; None otherwise."""
    if target not in COMPARISONS or isinstance(constant, bool) or not isinstance(constant, (int, float)):
        return None
    kind = COMPARISONS[target] if tensor_first else _REFLECTED[COMPARISONS[target]]
    low, high = bounds
    c = float(constant)
    if math.isnan(c):
        return False
    always = {"<": high < c, "<=": high <= c, ">": low > c, ">=": low >= c}[kind]
    never = {"<": low >= c, "<=": low > c, ">": high <= c, ">=": high < c}[kind]
    return True if always else False if never else None
