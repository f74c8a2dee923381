"""Python floats computed from symbolic sizes (SymFloat nodes) as 0-d float64 values of the graph.

With dynamic sizes a graph computes floats from its sizes: BatchNorm's unbiased running variance scales by
`n / (n - 1)` (`operator.truediv` of two SymInts), the backward of `var` and `std` multiplies by
`1 / sym_float(n - 1)`. Eager computes such a float in Python (double precision) and passes it to the op as a
scalar. kiln computes it the same way inside the kernel that reads it: a `SizeScalar`, a 0-d float64 value
whose body is the arithmetic over the size expressions, which the pointwise rules read through `operand` (cast
to the dtype they compute in, as eager casts its scalar) and which promotes as a Python float. Only ops that
read it so may take it (`reads_size_scalars`); anywhere else (an ATen call taking a number: a complex tensor's
`x * math.sqrt(n)`, `torch.full(size, n / 2)` where no rule reads it) the op runs through ATen, given the Python
float the wrapper computes from the call's sizes (`python_float`), as eager's program computes it.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable

import sympy
import torch

from kiln.lower import ir
from kiln.lower.values import IndexFunction, SizeScalar, Unsupported, cast, const

aten = torch.ops.aten

# the Python operations on sizes and floats a graph records, and the element op computing each in float64
SYM_FLOAT_OPS = {
    operator.truediv: "truediv", operator.mul: "mul", operator.add: "add", operator.sub: "sub",
    operator.neg: "neg", operator.pow: "pow", torch.sym_float: None, math.sqrt: "sqrt", torch._sym_sqrt: "sqrt",
}

# ops whose lowering reads a number argument through `operand`, as it reads a tensor: (op, the arguments)
OPERAND_SCALARS = {
    **{op: ("other",) for op in (aten.mul.Scalar, aten.div.Scalar, aten.eq.Scalar, aten.ne.Scalar,
                                 aten.lt.Scalar, aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar)},
    **{op: ("other", "alpha") for op in (aten.add.Scalar, aten.sub.Scalar)},
    **{op: ("alpha",) for op in (aten.add.Tensor, aten.sub.Tensor)},
    aten.pow.Tensor_Scalar: ("exponent",), aten.clamp.default: ("min", "max"), aten.clamp_min.default: ("min",),
    aten.where.ScalarSelf: ("self",), aten.where.ScalarOther: ("other",), aten.where.Scalar: ("self", "other"),
    aten.full.default: ("fill_value",), aten.full_like.default: ("fill_value",), aten.scalar_tensor.default: ("s",),
}


def sym_float_value(op, args: tuple) -> SizeScalar:
    """The 0-d float64 value of `op(*args)`, whose result is a SymFloat; args are size expressions, numbers
    or earlier such values."""
    if op not in SYM_FLOAT_OPS:
        raise Unsupported(f"{op}: a float computed from sizes by an operation kiln does not lower")
    operands = tuple(_float_operand(a) for a in args)
    name = SYM_FLOAT_OPS[op]
    body = operands[0] if name is None else ir.Op(name, operands, torch.float64)
    return SizeScalar((), torch.float64, body)


def _float_operand(a) -> ir.Expr:
    if isinstance(a, IndexFunction) and a.ndim == 0:
        return cast(a.body, torch.float64)
    if isinstance(a, sympy.Basic):
        return cast(ir.IndexValue(a, torch.int64), torch.float64)
    if isinstance(a, (int, float)) and not isinstance(a, bool):
        return const(a, torch.float64)
    raise Unsupported(f"an operand of type {type(a).__name__} in a float computed from sizes")


def reads_size_scalars(op, args: tuple, kwargs: dict) -> bool:
    """Whether kiln's lowering rule of `op` reads every SizeScalar among its arguments as a value: where its
    schema takes a tensor or the rule reads the number as an operand. Elsewhere (an ATen call taking a
    number) the op runs through ATen, given the float as eager's program gives it (`wrapper_float`)."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return True
    readable = OPERAND_SCALARS.get(op, ())
    for k, arg in enumerate(schema.arguments):
        value = args[k] if k < len(args) and not arg.kwarg_only else kwargs.get(arg.name)
        if isinstance(value, SizeScalar) and not ("Tensor" in str(arg.type) or arg.name in readable):
            return False
    return True


# the element ops of a SizeScalar's body and the Python that computes each, as eager's program does in float64
_PYTHON_FLOAT_OPS = {"truediv": "({} / {})", "mul": "({} * {})", "add": "({} + {})", "sub": "({} - {})",
                     "neg": "(-{})", "pow": "({} ** {})", "sqrt": "math.sqrt({})"}


def wrapper_float(value: SizeScalar) -> ir.Expr:
    """`value`'s body, checked to be what the wrapper computes as a Python float (`python_float`)."""
    python_float(value.body, lambda e: "")
    return value.body


def python_float(e: ir.Expr, size: Callable[[object], str]) -> str:
    """Python source computing `e`, a SizeScalar's body (float64 arithmetic over sizes), as a Python float; `size`
    prints a size expression. Unsupported where it is not such a body."""
    if isinstance(e, ir.Const):
        return repr(float(e.value)) if math.isfinite(e.value) else f"float({str(float(e.value))!r})"
    if isinstance(e, ir.Op) and e.name == "cast" and e.dtype == torch.float64 and isinstance(e.args[0], ir.IndexValue):
        return f"float({size(e.args[0].expr)})"
    if isinstance(e, ir.Op) and e.name in _PYTHON_FLOAT_OPS and e.dtype == torch.float64:
        return _PYTHON_FLOAT_OPS[e.name].format(*(python_float(a, size) for a in e.args))
    raise Unsupported(f"a float computed from sizes as {e}")
