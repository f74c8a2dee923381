"""`t.item()` under `fullgraph=True`: the number stays in the graph as a 0-d tensor, for the checks that read it.

torch.compile with `fullgraph=True` captures `.item()` as an unbacked symbol (it turns `capture_scalar_outputs`
on), so that model code such as `assert lengths.max().item() <= slen` (XLM, FlauBERT) or
`assert torch.all(ids >= 0).item(), msg` (ProphetNet) costs no graph break; with `fullgraph=False` it breaks at
`.item()`, and so does kiln. kiln keeps the number as a 0-d tensor of a dtype that holds it exactly (float64,
int64 or bool) and models what such checks do with it: a comparison with a number, and the truth test of an
`assert` (a graph-side `torch._assert_async`, see `opcodes.control`), and arithmetic with a tensor where the
0-d tensor promotes as the Python number would (`x * t.max().item()`, `item_arithmetic`). Everything else needs
the Python number itself, or a size (torch.compile's unbacked symbol), which kiln does not make: a graph break
(under `fullgraph=True`, an error where torch.compile captures a size).
"""
from __future__ import annotations

import operator

from kiln.capture.breaks import GraphBreak
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue, ScalarInputValue
from kiln.capture.values.symbolic import SymValue
from kiln.capture.values.tensor import ItemValue, TensorValue, trace_op

_INT64_RANGE = range(-2**63, 2**63)
_EXACT_IN_FLOAT64 = range(-2**53, 2**53 + 1)  # the ints a float64 holds exactly (Python compares int and float exactly)
COMPARISONS = frozenset((operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne))


def compare_items(state, fn, a: Value, b: Value) -> Value:
    """`a < b` where one side is an `ItemValue`: a bool `ItemValue`, computed where the comparison is exact."""
    a, b = (ConstantValue(v.specialize()) if isinstance(v, ScalarInputValue) else v for v in (a, b))
    kinds = [_operand_kind(v) for v in (a, b)]
    if None in kinds or float in kinds and not all(_fits_float(v) for v in (a, b)):
        raise GraphBreak("tensor_to_python", f"Tensor.item() compared ({fn.__name__}) with {b!r}")
    operands = [v.tensor if isinstance(v, ItemValue) else v for v in (a, b)]
    if not isinstance(operands[0], TensorValue):  # `n < t.item()`: the tensor first, the comparison mirrored
        operands, fn = operands[::-1], _MIRRORED[fn]
    return ItemValue(trace_op(state, "call_function", fn, operands, {}), bool)


_MIRRORED = {operator.lt: operator.gt, operator.le: operator.ge, operator.gt: operator.lt, operator.ge: operator.le,
             operator.eq: operator.eq, operator.ne: operator.ne}


def _operand_kind(value: Value) -> type | None:
    """int (bool counts as one), float, or None for an operand compared otherwise than exactly."""
    if isinstance(value, ItemValue):
        return float if value.kind is float else int
    if isinstance(value, SymValue) and value.python_type() is int:  # an int input made a symbol (within int64)
        return int
    if type(value) is ConstantValue and type(value.value) in (int, bool) and value.value in _INT64_RANGE:
        return int
    if type(value) is ConstantValue and type(value.value) is float:
        return float
    return None


def _fits_float(value: Value) -> bool:
    """Whether a float64 comparison of this operand is Python's (an int held in int64 may not be)."""
    if isinstance(value, ItemValue):
        return value.kind is float
    if isinstance(value, SymValue):  # its values may lie beyond what float64 holds exactly
        return False
    return type(value.value) is float or value.value in _EXACT_IN_FLOAT64


_TENSOR_ARITHMETIC = frozenset((operator.add, operator.sub, operator.mul, operator.truediv))


def item_arithmetic(state, fn, args: list[Value]) -> Value | None:
    """`x * n` for a tensor `x` of at least one dimension and `n = t.item()`: the op with the 0-d tensor that
    holds n, where its result is what the Python number gives. A 0-d operand takes part in type promotion only
    across categories: an int or bool `n` leaves x's dtype as Python's int does, a float `n` only against a
    floating-point x (against an int x Python's float makes the default dtype, a float64 0-d tensor float64);
    a bool `n` in + and * only. None for anything else (a break)."""
    if fn not in _TENSOR_ARITHMETIC or len(args) != 2:
        return None
    items = [a for a in args if isinstance(a, ItemValue)]
    tensors = [a for a in args if isinstance(a, TensorValue)]
    if len(items) != 1 or len(tensors) != 1 or tensors[0].fake.dim() == 0:
        return None
    if items[0].kind is float and not tensors[0].fake.is_floating_point() and not tensors[0].fake.is_complex():
        return None
    if items[0].kind is bool and fn not in (operator.add, operator.mul):  # torch refuses `-` of a bool tensor
        return None
    operands = [a.tensor if isinstance(a, ItemValue) else a for a in args]
    return trace_op(state, "call_function", fn, operands, {})
