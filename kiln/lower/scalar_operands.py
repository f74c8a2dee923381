"""Scalar operands of bf16/fp16 ops, read as eager's CPU kernels read them.

Eager computes a half-type op in float (its math type) and rounds the result once. A scalar operand (a
Python number, a float computed from sizes, or a 0-d tensor of another dtype: `h * torch.tensor(0.1)`,
`h + 0.1`, `h * math.sqrt(n)`) reaches the kernel one of two ways:

- through TensorIterator, which casts it to the op's dtype first: `h + 0.1` adds half(0.1). Most binary
  kernels (add, sub, pow, fmod, remainder, atan2, hypot, copysign, the comparisons, ...) read it so
  (`ROUNDED`);
- at its original value, in float: the CPU kernels of mul and div (every rounding mode) take a scalar second
  operand out of the iteration (`iter.original_scalar_value<opmath_t>(2)`) and compute `float(a) * b`, or
  `trunc(float(a) / b)`, rounding once (`ORIGINAL_SECOND`).

The lowering rules read a Python number at its value (a literal of the compute type, float) and cast a 0-d
tensor or a float computed from sizes to the op's dtype; a rounding division rounds its quotient to the half
type before rounding it to an integer, as eager does between two tensors. `eager_reads` corrects them where
eager reads otherwise: a number an op of `ROUNDED` reads becomes its value rounded to the half type, and an
op of `ORIGINAL_SECOND` with a scalar second operand is computed in float32 and rounded once.

Eager's vectorized loop and its scalar loop (the last `n % width` elements of a contiguous tensor, and every
element where an operand's inner stride is neither 1 nor 0) round differently in some ops; kiln computes every
element as the vectorized loop does. `add(a, b, alpha=0.1)` on half tensors: the vector loop rounds alpha to the
half type and `a + alpha * b` once, in float; the scalar loop rounds `alpha * b` to the half type first.

Only graphs on the CPU: CUDA's kernels read CPU scalars by rules of their own (`gpu_kernel_with_scalars`
reads the original value in either position; a division by a scalar multiplies by its reciprocal), which
no machine here runs; a CUDA graph is lowered as before.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from kiln.lower import ir
from kiln.lower.ops.common import promote
from kiln.lower.values import IndexFunction, SizeScalar, cast

aten = torch.ops.aten

HALF_DTYPES = (torch.float16, torch.bfloat16)

ROUNDED = frozenset({
    aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Tensor, aten.rsub.Scalar,
    aten.pow.Tensor_Scalar, aten.pow.Scalar, aten.fmod.Tensor, aten.fmod.Scalar, aten.remainder.Tensor,
    aten.remainder.Scalar, aten.atan2.default, aten.hypot.default, aten.copysign.Tensor, aten.copysign.Scalar,
    *(getattr(aten, name).Tensor for name in ("eq", "ne", "lt", "le", "gt", "ge")),
    *(getattr(aten, name).Scalar for name in ("eq", "ne", "lt", "le", "gt", "ge")),
})
"""Ops whose CPU kernel reads every scalar operand cast to the op's dtype."""

ORIGINAL_SECOND = frozenset({aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar,
                             aten.div.Tensor_mode, aten.div.Scalar_mode})
"""Ops whose CPU kernel reads a scalar second operand at its original value, in float."""


def eager_reads(op, rule: Callable, meta, args: tuple, kwargs: dict) -> tuple[Callable, tuple, dict]:
    """(rule, args, kwargs) lowering `op` with its scalar operands read as eager's CPU kernel reads them
    (see the module docstring); `rule` and the arguments as they are where nothing differs."""
    if not isinstance(meta, torch.Tensor) or meta.device.type != "cpu":
        return rule, args, kwargs
    if op in ROUNDED and _math_dtype(args) in HALF_DTYPES:
        dtype = _math_dtype(args)
        return rule, tuple(_rounded(a, dtype) for a in args), {k: _rounded(v, dtype) for k, v in kwargs.items()}
    if op in ORIGINAL_SECOND and meta.dtype in HALF_DTYPES and len(args) > 1 and _scalar(args[1], meta):
        return _in_float(rule), args, kwargs
    return rule, args, kwargs


def _math_dtype(args: tuple) -> torch.dtype | None:
    """The dtype eager's op computes in: the promotion of its first two operands (None with fewer)."""
    operands = [a for a in args if isinstance(a, (IndexFunction, bool, int, float))][:2]
    if len(operands) < 2 or not any(isinstance(a, IndexFunction) for a in operands):
        return None
    return promote(*operands)


def _rounded(a, dtype: torch.dtype):
    """`a`, a Python number or a float computed from sizes, as the value of `dtype` it converts to; any other
    operand (a tensor, a bool, an option) as it is."""
    if isinstance(a, SizeScalar):  # still a float64 scalar to promotion, holding the half-type value
        return SizeScalar((), torch.float64, cast(cast(a.body, dtype), torch.float64))
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        return a
    return ir.converted(float(a) if isinstance(a, float) else a, torch.float64 if isinstance(a, float)
                        else torch.int64, dtype)


def _scalar(a, meta: torch.Tensor) -> bool:
    """Is `a` a scalar operand: a Python number, a float computed from sizes, or a 0-d tensor of another dtype
    than the result?"""
    if isinstance(a, SizeScalar) or (isinstance(a, (int, float)) and not isinstance(a, bool)):
        return True
    return isinstance(a, IndexFunction) and a.ndim == 0 and a.dtype != meta.dtype


def _in_float(rule: Callable) -> Callable:
    """`rule` computing in float32 from float32 operands, its result rounded once to the half type."""
    def in_float(ctx, meta, *args, **kwargs):
        out = rule(ctx, meta.to(torch.float32), *args, **kwargs)
        return IndexFunction(out.size, meta.dtype, cast(out.body, meta.dtype))
    return in_float
