"""Scalar operands of bf16/fp16 ops, read as eager's CPU and CUDA kernels read them.

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

CUDA's kernels read by rules of their own, keyed by where the operand is. A host scalar (a Python number, a
float computed from sizes, or a 0-d tensor on the CPU) is taken out of the iteration: add, sub and mul
(`opmath_gpu_kernel_with_scalars`) read it, and their alpha, at its original value in float in either position
(the CPU's vector loop rounds alpha), and the divisions read a second operand so (`iter.is_cpu_scalar(2)`: a
true division multiplies by the float reciprocal of its value) but a first one as the half type (their functor
takes `scalar_t`). A 0-d tensor on the GPU is an ordinary operand: cast to the op's dtype first, as the
lowering rules cast it. Every other op of `ROUNDED` rounds a Python number there too (`CUDA_ROUNDED`).

So a CUDA op whose result is a half type is lowered in float32, rounded once, where a host scalar is an
operand of `CUDA_ORIGINAL` or the second operand of `CUDA_ORIGINAL_SECOND`; a Python number that is the first
operand of a division is rounded. A true division by a host scalar, whatever the result's float dtype, is the
product with the divisor's reciprocal taken in the op's math type (float32, or double for float64): a number's
while lowering, a 0-d CPU tensor's or a size's in the kernel. The rules apply by
the device of the op's result: an op on CPU values inside a CUDA graph is read as the CPU reads it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from kiln.lower import ir
from kiln.lower.ops import LOWERINGS
from kiln.lower.ops.common import promote
from kiln.lower.values import IndexFunction, SizeScalar, cast
from kiln.runtime.host_scalars import is_host_scalar

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

DIVISIONS = frozenset({aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode})

ORIGINAL_SECOND = frozenset({aten.mul.Tensor, aten.mul.Scalar, *DIVISIONS})
"""Ops whose CPU kernel reads a scalar second operand at its original value, in float."""

CUDA_ORIGINAL = frozenset({aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Tensor,
                           aten.rsub.Scalar, aten.mul.Tensor, aten.mul.Scalar})
"""Ops whose CUDA kernel reads a host scalar at its original value, in float, in either position."""

CUDA_ORIGINAL_SECOND = DIVISIONS
"""Ops whose CUDA kernel reads a host scalar second operand at its original value, in float."""

TRUE_DIVISIONS = frozenset({aten.div.Tensor, aten.div.Scalar})
"""Divisions that CUDA computes as a product with the divisor's float reciprocal where the divisor is a host
scalar."""

CUDA_ROUNDED = ROUNDED - CUDA_ORIGINAL
"""Ops whose CUDA kernel reads every scalar operand cast to the op's dtype."""


def host_scalar_operands(fx_args: tuple) -> frozenset[int]:
    """The positions of the 0-d CPU tensors among an FX node's arguments (their `meta['val']`)."""
    return frozenset(k for k, a in enumerate(fx_args) if isinstance(a, torch.fx.Node)
                     and is_host_scalar(a.meta.get("val")))


def eager_reads(op, rule: Callable, meta, args: tuple, kwargs: dict,
                host_scalars: frozenset[int] = frozenset()) -> tuple[Callable, tuple, dict]:
    """(rule, args, kwargs) lowering `op` with its scalar operands read as eager's kernel on `meta`'s device
    reads them (see the module docstring); `rule` and the arguments as they are where nothing differs.
    `host_scalars`: the positions of `args` that are 0-d CPU tensors."""
    if not isinstance(meta, torch.Tensor):
        return rule, args, kwargs
    if meta.device.type == "cuda":
        return _cuda_reads(op, rule, meta, args, kwargs, host_scalars)
    if meta.device.type != "cpu":
        return rule, args, kwargs
    if op in ROUNDED and _math_dtype(args) in HALF_DTYPES:
        dtype = _math_dtype(args)
        return rule, tuple(_rounded(a, dtype) for a in args), {k: _rounded(v, dtype) for k, v in kwargs.items()}
    if op in ORIGINAL_SECOND and meta.dtype in HALF_DTYPES and len(args) > 1 and _scalar(args[1], meta):
        return _in_float(rule), args, kwargs
    return rule, args, kwargs


def _cuda_reads(op, rule: Callable, meta: torch.Tensor, args: tuple, kwargs: dict,
                host_scalars: frozenset[int]) -> tuple[Callable, tuple, dict]:
    """`eager_reads` for an op whose result is on a CUDA device."""
    if op in CUDA_ROUNDED and _math_dtype(args) in HALF_DTYPES:
        dtype = _math_dtype(args)
        return rule, tuple(_rounded(a, dtype) for a in args), {k: _rounded(v, dtype) for k, v in kwargs.items()}
    if op in TRUE_DIVISIONS and len(args) == 2 and _host_scalar(args, 1, host_scalars):
        if meta.dtype in HALF_DTYPES:
            return _in_float(LOWERINGS[aten.mul.Tensor]), (args[0], _reciprocal(args[1], torch.float32)), kwargs
        if meta.dtype in (torch.float32, torch.float64):
            return LOWERINGS[aten.mul.Tensor], (args[0], _reciprocal(args[1], meta.dtype)), kwargs
    if meta.dtype not in HALF_DTYPES:
        return rule, args, kwargs
    if op in CUDA_ORIGINAL and (any(_host_scalar(args, k, host_scalars) for k in (0, 1))
                                or _number(kwargs.get("alpha"))):
        return _in_float(rule), _device_operands_cast(args, meta.dtype, host_scalars), kwargs
    if op in CUDA_ORIGINAL_SECOND and _host_scalar(args, 1, host_scalars):
        return _in_float(rule), _device_operands_cast(args, meta.dtype, host_scalars), kwargs
    if op in DIVISIONS and args and _number(args[0]):
        return rule, (_rounded(args[0], meta.dtype), *args[1:]), kwargs
    return rule, args, kwargs


def _host_scalar(args: tuple, k: int, host_scalars: frozenset[int]) -> bool:
    """Is `args[k]` a host scalar: a Python number, a float computed from sizes, or a 0-d CPU tensor?"""
    return k < len(args) and (k in host_scalars or _number(args[k]))


def _device_operands_cast(args: tuple, dtype: torch.dtype, host_scalars: frozenset[int]) -> tuple:
    """`args` with each tensor operand on the device cast to `dtype`, the op's, as CUDA's kernel reads it (a 0-d
    float32 tensor on the GPU as half(s)) before `_in_float` computes in float32."""
    return tuple(cast_to(a, dtype) if _device_tensor(a) and k not in host_scalars and a.dtype != dtype
                 else a for k, a in enumerate(args))


def _device_tensor(a) -> bool:
    """Is `a` a tensor operand, not a float computed from sizes (a host scalar: the kernel reads its value)?"""
    return isinstance(a, IndexFunction) and not isinstance(a, SizeScalar)


def cast_to(a: IndexFunction, dtype: torch.dtype) -> IndexFunction:
    return IndexFunction(a.size, dtype, cast(a.body, dtype))


def _literal(a) -> bool:
    """Is `a` a Python number (known while lowering, unlike a float computed from sizes)?"""
    return isinstance(a, (int, float)) and not isinstance(a, bool)


def _reciprocal(b, dtype: torch.dtype):
    """`1 / b` as CUDA's true division takes it from a host divisor `b` (a number, a float computed from sizes, a
    0-d CPU tensor): in the op's math type `dtype`, from `b` held in it; a number's on the host, as CUDA's."""
    if _literal(b):
        return (torch.tensor(1.0, dtype=dtype) / torch.tensor(float(b), dtype=dtype)).item()
    return IndexFunction(b.size, dtype, ir.Op("reciprocal", (cast(b.body, dtype),), dtype))


def _number(a) -> bool:
    return isinstance(a, SizeScalar) or (isinstance(a, (int, float)) and not isinstance(a, bool))


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
    if _number(a):
        return True
    return isinstance(a, IndexFunction) and a.ndim == 0 and a.dtype != meta.dtype


def _in_float(rule: Callable) -> Callable:
    """`rule` computing in float32 from float32 operands, its result rounded once to the half type."""
    def in_float(ctx, meta, *args, **kwargs):
        out = rule(ctx, meta.to(torch.float32), *args, **kwargs)
        return IndexFunction(out.size, meta.dtype, cast(out.body, meta.dtype))
    return in_float
