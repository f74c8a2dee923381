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

CUDA's kernels read a CPU scalar (a Python number, a float computed from sizes) by rules of their own
(`cuda_reads`): TensorIterator converts it to the op's dtype, and `gpu_kernel_with_scalars` reads that value in
either position, mul and div included (`h * 0.1` multiplies by float(half(0.1))). A true or truncating division
by one multiplies by its reciprocal (BinaryDivTrueKernel.cu: `a * (opmath)(1.0 / (double)b)`, rounded once;
BinaryDivTruncKernel.cu: `trunc(a * (1 / b))`, the reciprocal and the product in the accumulate type, float for
half types and float32). A floor division by one (BinaryDivFloorKernel.cu: an fmod-based formula) keeps kiln's
rule. A 0-d CUDA tensor is no CPU scalar: it is read as a tensor, cast to the op's dtype, as kiln reads it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from kiln.lower import ir
from kiln.lower.ops.common import operand, out_info, promote
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
    """(rule, args, kwargs) lowering `op` with its scalar operands read as eager's kernel reads them (see the
    module docstring); `rule` and the arguments as they are where nothing differs."""
    if not isinstance(meta, torch.Tensor):
        return rule, args, kwargs
    if meta.device.type == "cuda":
        return cuda_reads(op, rule, meta, args, kwargs)
    if meta.device.type != "cpu":
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


CUDA_RECIPROCAL_DIVISIONS = {aten.div.Tensor: None, aten.div.Scalar: None, aten.div.Tensor_mode: "trunc",
                             aten.div.Scalar_mode: "trunc"}
"""Divisions whose CUDA kernel multiplies by the reciprocal of a CPU scalar divisor -> the rounding mode they do
it for (None: true division)."""


def cuda_reads(op, rule: Callable, meta, args: tuple, kwargs: dict) -> tuple[Callable, tuple, dict]:
    """`eager_reads` for a graph on CUDA: a CPU scalar operand of a half-type op read rounded to the half type,
    and a true or truncating division of a floating tensor by a CPU scalar as a product with its reciprocal."""
    mode = kwargs.get("rounding_mode", args[2] if len(args) > 2 else None)
    if (op in CUDA_RECIPROCAL_DIVISIONS and CUDA_RECIPROCAL_DIVISIONS[op] == mode and meta.dtype.is_floating_point
            and _cpu_scalar(args[1])):
        return _times_reciprocal(rule, meta.dtype, mode), args[:2], {}
    if (op in ROUNDED or op in ORIGINAL_SECOND) and _math_dtype(args) in HALF_DTYPES:
        dtype = _math_dtype(args)
        return rule, tuple(_rounded(a, dtype) for a in args), {k: _rounded(v, dtype) for k, v in kwargs.items()}
    return rule, args, kwargs


def _cpu_scalar(a) -> bool:
    """Is `a` a scalar a CUDA kernel reads from the CPU: a Python number or a float computed from sizes?"""
    return isinstance(a, SizeScalar) or (isinstance(a, (int, float)) and not isinstance(a, bool))


def _times_reciprocal(rule: Callable, dtype: torch.dtype, mode: str | None) -> Callable:
    """The division `rule` as CUDA's kernel computes a division by a CPU scalar `b`: b converted to `dtype`,
    its reciprocal in the math type (the true division's computed in float64 and cast, the truncating one's
    divided in the math type: the same correctly rounded value, which kiln computes in float64 too, as Triton's
    float32 division is not correctly rounded), the product in the math type, truncated for "trunc", rounded
    once to `dtype`."""
    math = torch.float32 if dtype in HALF_DTYPES else dtype

    def times_reciprocal(ctx, meta, a, b):
        divisor = _scalar_body(b, dtype)
        wide = torch.float64
        inverse = cast(ir.Op("truediv", (ir.Const(1.0, wide), cast(divisor, wide)), wide), math)
        size, _ = out_info(meta)
        product = ir.Op("mul", (cast(operand(a, size, dtype), math), inverse), math)
        if mode == "trunc":
            product = ir.Op("trunc", (product,), math)
        return IndexFunction(size, dtype, cast(product, dtype))
    del rule  # replaced whole: eager's kernel computes neither a quotient nor its rounding
    return times_reciprocal


def _scalar_body(b, dtype: torch.dtype) -> ir.Expr:
    """The IR value of a CPU scalar `b` converted to `dtype` (as TensorIterator converts it)."""
    if isinstance(b, SizeScalar):
        return cast(b.body, dtype)
    return ir.Const(ir.converted(b, torch.float64 if isinstance(b, float) else torch.int64, dtype), dtype)

