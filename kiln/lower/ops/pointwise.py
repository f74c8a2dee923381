"""Pointwise lowerings: each ATen elementwise op becomes one `Op` over broadcast operands.

The tables say, per op, the IR op name and how eager types it:
  ARITH    computes in the result dtype (inputs cast to it)
  COMPARE  computes in the promoted input dtype, yields bool
  LOGICAL  casts inputs to bool, yields bool
"""
from __future__ import annotations

import torch

from kiln.lower import ir
from kiln.lower.ops.common import SUPPORTED_DTYPES, operand, out_info, promote
from kiln.lower.ops.registry import register
from kiln.lower.values import IndexFunction, SizeScalar, Unsupported, cast, const

aten = torch.ops.aten

ARITH = {
    "add": [aten.add.Tensor, aten.add.Scalar], "sub": [aten.sub.Tensor, aten.sub.Scalar],
    "mul": [aten.mul.Tensor, aten.mul.Scalar], "abs": [aten.abs.default],
    # a lazily negated view (`z.conj().imag`) is read for its values: a kernel computes them
    "neg": [aten.neg.default, aten._neg_view.default],
    "sign": [aten.sign.default], "exp": [aten.exp.default], "exp2": [aten.exp2.default],
    "log": [aten.log.default], "log2": [aten.log2.default], "log10": [aten.log10.default],
    "log1p": [aten.log1p.default], "expm1": [aten.expm1.default], "sqrt": [aten.sqrt.default],
    "rsqrt": [aten.rsqrt.default], "reciprocal": [aten.reciprocal.default],
    "sigmoid": [aten.sigmoid.default], "tanh": [aten.tanh.default], "erf": [aten.erf.default],
    "erfc": [aten.erfc.default], "lgamma": [aten.lgamma.default], "digamma": [aten.digamma.default],
    "sin": [aten.sin.default], "cos": [aten.cos.default],
    "tan": [aten.tan.default], "asin": [aten.asin.default], "acos": [aten.acos.default],
    "atan": [aten.atan.default], "sinh": [aten.sinh.default], "cosh": [aten.cosh.default],
    "asinh": [aten.asinh.default], "acosh": [aten.acosh.default], "atanh": [aten.atanh.default],
    "atan2": [aten.atan2.default], "floor": [aten.floor.default], "ceil": [aten.ceil.default],
    "round": [aten.round.default], "trunc": [aten.trunc.default],
    "pow": [aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar],
    "mod": [aten.remainder.Tensor, aten.remainder.Scalar], "fmod": [aten.fmod.Tensor, aten.fmod.Scalar],
    "bitwise_and": [aten.bitwise_and.Tensor, aten.bitwise_and.Scalar],
    "bitwise_or": [aten.bitwise_or.Tensor, aten.bitwise_or.Scalar],
    "bitwise_xor": [aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar],
    "bitwise_not": [aten.bitwise_not.default],
    "copysign": [aten.copysign.Tensor, aten.copysign.Scalar], "hypot": [aten.hypot.default],
}
COMPARE = {
    "eq": [aten.eq.Tensor, aten.eq.Scalar], "ne": [aten.ne.Tensor, aten.ne.Scalar],
    "lt": [aten.lt.Tensor, aten.lt.Scalar], "le": [aten.le.Tensor, aten.le.Scalar],
    "gt": [aten.gt.Tensor, aten.gt.Scalar], "ge": [aten.ge.Tensor, aten.ge.Scalar],
}
LOGICAL = {
    "logical_and": [aten.logical_and.default], "logical_or": [aten.logical_or.default],
    "logical_xor": [aten.logical_xor.default], "logical_not": [aten.logical_not.default],
}
PREDICATE = {"isnan": [aten.isnan.default], "isinf": [aten.isinf.default]}
# Rounding ops that return an integer tensor as it is.
INTEGER_IDENTITY = frozenset({"floor", "ceil", "round", "trunc"})
# on bool tensors eager computes these as logic (True + True is True): C++ and Triton would add them as integers,
# and a fused consumer would see 2 before the result is stored as bool
BOOL_AS_LOGICAL = {"bitwise_and": "logical_and", "bitwise_or": "logical_or", "bitwise_xor": "logical_xor",
                   "add": "logical_or", "mul": "logical_and"}


def _arith(name):
    def rule(ctx, meta, *args, **kwargs):
        size, dtype = out_info(meta)
        if isinstance(kwargs.get("alpha"), (SizeScalar, float)) and not dtype.is_floating_point:
            raise Unsupported("a float alpha of an integer op: ATen raises eager's error when the graph runs")
        if name == "bitwise_not" and dtype == torch.bool:
            return IndexFunction(size, dtype, ir.Op("logical_not", (operand(args[0], size, dtype),), dtype))
        if name in BOOL_AS_LOGICAL and dtype == torch.bool:
            ops = tuple(operand(a, size, dtype) for a in args)
            return IndexFunction(size, dtype, ir.Op(BOOL_AS_LOGICAL[name], ops, dtype))
        ops = tuple(operand(a, size, dtype) for a in args)
        if name in INTEGER_IDENTITY and not dtype.is_floating_point:
            return IndexFunction(size, dtype, ops[0])  # an integer is its own floor (a double would round it)
        alpha = kwargs.get("alpha", 1)
        if isinstance(alpha, IndexFunction) or alpha != 1:  # a number, or one computed from sizes (`n / 2`)
            fused = meta.device.type == "cuda"
            return IndexFunction(size, dtype, _with_alpha(name, ops, operand(alpha, size, dtype), dtype, fused))
        number_exponent = len(args) > 1 and isinstance(args[1], (int, float)) and not isinstance(args[1], bool)
        return IndexFunction(size, dtype, _simplify_pow(name, ops, dtype, number_exponent))
    return rule


def _with_alpha(name, ops, alpha, dtype, fused: bool):
    """`a + alpha * b` (or `-`), as eager computes it: for a half type in float, rounded once at the end (the
    product rounded to the half type on its own would be a second rounding). `fused`: as CUDA's kernel, whose
    compiler contracts it into one fused multiply-add (`a - alpha * b` is `a + (-alpha) * b` there); floats only."""
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    a, b, alpha = (cast(x, compute) for x in (*ops, alpha))
    if fused and compute.is_floating_point:
        factor = alpha if name == "add" else ir.Op("neg", (alpha,), compute)
        return cast(ir.Op("fma", (b, factor, a), compute), dtype)
    return cast(ir.Op(name, (a, ir.Op("mul", (b, alpha), compute)), compute), dtype)


def _simplify_pow(name, ops, dtype, number_exponent: bool):
    """pow by a constant as eager computes it: exactly where the result is exact (x * x, x, 1 / x); `POWERS` only
    for an exponent given as a number (eager takes pow for a tensor, even one full of 3.0 that kiln folds)."""
    if name == "pow" and isinstance(ops[1], ir.Const):
        e = ops[1].value
        if e == 2:
            return ir.Op("mul", (ops[0], ops[0]), dtype)
        if e == 1:
            return ops[0]
        if e == -1 and dtype.is_floating_point:
            return ir.Op("reciprocal", (ops[0],), dtype)
        if number_exponent and e in POWERS and dtype.is_floating_point and (dtype, abs(e)) != (torch.float16, 0.5):
            return _in_eager_steps(POWERS[e], ops[0], dtype)
    return ir.Op(name, ops, dtype)


# ATen's CPU pow by these exponents is a product or a root, not a pow: x * x * x, 1 / (x * x), sqrt(x), 1 / sqrt(x)
# (sqrt(-0.0) is -0.0 and rsqrt(-0.0) -inf, where pow gives 0.0 and inf; fp16's +-0.5 take pow). GELU's tanh
# form cubes every activation, and a pow costs a log and an exp per element.
POWERS = {
    3: lambda x, t: ir.Op("mul", (ir.Op("mul", (x, x), t), x), t),
    -2: lambda x, t: ir.Op("reciprocal", (ir.Op("mul", (x, x), t),), t),
    0.5: lambda x, t: ir.Op("sqrt", (x,), t),
    -0.5: lambda x, t: ir.Op("rsqrt", (x,), t),
}


def _in_eager_steps(power, x, dtype):
    """`power` of `x` rounded as eager rounds it: bf16 after every step (ATen runs these over Vectorized<BFloat16>,
    whose ops round to bf16), fp16 once (its kernel computes in float), float32 and float64 at every step."""
    if dtype != torch.float16:
        return power(x, dtype)
    return cast(power(cast(x, torch.float32), torch.float32), dtype)


def _compare(name):
    def rule(ctx, meta, a, b):
        size, dtype = out_info(meta)
        compute = promote(a, b)
        return IndexFunction(size, dtype, ir.Op(name, (operand(a, size, compute), operand(b, size, compute)), dtype))
    return rule


def _logical(name):
    def rule(ctx, meta, *args):
        size, dtype = out_info(meta)
        body = ir.Op(name, tuple(operand(a, size, torch.bool) for a in args), torch.bool)
        return IndexFunction(size, dtype, cast(body, dtype))
    return rule


def _predicate(name):
    def rule(ctx, meta, a):
        size, dtype = out_info(meta)
        if not a.dtype.is_floating_point:
            return IndexFunction(size, dtype, const(False, dtype))
        return IndexFunction(size, dtype, ir.Op(name, (operand(a, size, a.dtype),), dtype))
    return rule


for _table, _factory in ((ARITH, _arith), (COMPARE, _compare), (LOGICAL, _logical), (PREDICATE, _predicate)):
    for _name, _ops in _table.items():
        register(*_ops)(_factory(_name))


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(ctx, meta, a, b, rounding_mode=None):
    size, dtype = out_info(meta)
    if rounding_mode is None:
        return IndexFunction(size, dtype, ir.Op("truediv", (operand(a, size, dtype), operand(b, size, dtype)), dtype))
    ops = (operand(a, size, dtype), operand(b, size, dtype))
    if dtype.is_floating_point and rounding_mode == "trunc":
        return IndexFunction(size, dtype, ir.Op("trunc", (ir.Op("truediv", ops, dtype),), dtype))
    # floating floordiv is eager's div_floor (floor(a / b) rounds 1 // 0.1 up to 10); integer floordiv and
    # truncdiv raise on a zero divisor
    return IndexFunction(size, dtype, ir.Op("floordiv" if rounding_mode == "floor" else "truncdiv", ops, dtype))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, meta, cond, a, b):
    size, dtype = out_info(meta)
    return IndexFunction(size, dtype, ir.Op("where", (operand(cond, size, torch.bool), operand(a, size, dtype),
                                                    operand(b, size, dtype)), dtype))


@register(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp(ctx, meta, x, lo=None, hi=None):
    size, dtype = out_info(meta)
    body = operand(x, size, dtype)
    if lo is not None:
        body = ir.Op("maximum", (body, operand(lo, size, dtype)), dtype)
    if hi is not None:
        body = ir.Op("minimum", (body, operand(hi, size, dtype)), dtype)
    return IndexFunction(size, dtype, body)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(ctx, meta, x, hi):
    return clamp(ctx, meta, x, None, hi)


@register(aten.relu.default)
def relu(ctx, meta, x):
    size, dtype = out_info(meta)
    if dtype == torch.bool:
        raise Unsupported("relu of bool")
    return IndexFunction(size, dtype, ir.Op("maximum", (operand(x, size, dtype), const(0, dtype)), dtype))


@register(aten._to_copy.default)
def to_copy(ctx, meta, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    size, out_dtype = out_info(meta)
    if device is not None and torch.device(device).type != meta.device.type or x.dtype not in SUPPORTED_DTYPES:
        raise Unsupported("device or dtype change")
    return IndexFunction(size, out_dtype, cast(x.body, out_dtype))


@register(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default,
          torch.ops.prims.copy_strided.default)
def identity(ctx, meta, x, memory_format=None):
    """Copies and aliases: the same values (a graph output still gets eager's strides from `meta`)."""
    out_info(meta)
    return x


@register(aten.copy.default)
def copy(ctx, meta, dst, src, non_blocking=False):
    size, dtype = out_info(meta)
    return IndexFunction(size, dtype, operand(src, size, dtype))


@register(aten.fill.Scalar)
def fill(ctx, meta, x, value):
    size, dtype = out_info(meta)
    return IndexFunction(size, dtype, operand(value, size, dtype))


@register(aten.nextafter.default)
def nextafter(ctx, meta, a, b):
    """The next representable value of the result dtype: computed in float32, a half type's step would be
    float32's (eager steps by the half type's own ulp), so those stay ATen calls."""
    size, dtype = out_info(meta)
    if dtype not in (torch.float32, torch.float64):
        raise Unsupported(f"nextafter in {dtype}")
    return IndexFunction(size, dtype, ir.Op("nextafter", (operand(a, size, dtype), operand(b, size, dtype)), dtype))


def _nan_propagating(name):
    """maximum / minimum: NaN if either operand is. On the CPU the quiet NaN of eager's scalar loop (which a tensor
    shorter than a vector and strided operands see; its vectorized loop makes an all-ones NaN), on CUDA the
    operand's NaN, as the IR op returns it."""
    def rule(ctx, meta, a, b):
        size, dtype = out_info(meta)
        x, y = operand(a, size, dtype), operand(b, size, dtype)
        body = ir.Op(name, (x, y), dtype)
        if dtype.is_floating_point and meta.device.type == "cpu":
            either_nan = ir.Op("logical_or", (ir.Op("isnan", (x,), torch.bool), ir.Op("isnan", (y,), torch.bool)),
                               torch.bool)
            body = ir.Op("where", (either_nan, const(float("nan"), dtype), body), dtype)
        return IndexFunction(size, dtype, body)
    return rule


register(aten.maximum.default)(_nan_propagating("maximum"))
register(aten.minimum.default)(_nan_propagating("minimum"))


def _nan_ignoring(name):
    """fmax / fmin: maximum / minimum where a NaN loses to a number (eager's std::fmax); NaN only if both are."""
    def rule(ctx, meta, a, b):
        size, dtype = out_info(meta)
        x, y = operand(a, size, dtype), operand(b, size, dtype)
        body = ir.Op(name, (x, y), dtype)
        if dtype.is_floating_point:
            body = ir.Op("where", (ir.Op("isnan", (x,), torch.bool), y,
                                   ir.Op("where", (ir.Op("isnan", (y,), torch.bool), x, body), dtype)), dtype)
        return IndexFunction(size, dtype, body)
    return rule


register(aten.fmax.default)(_nan_ignoring("maximum"))
register(aten.fmin.default)(_nan_ignoring("minimum"))


@register(aten.ldexp.Tensor)
def ldexp(ctx, meta, x, other):
    """x * 2**other, as ATen computes it (a product with a power of two, in the result dtype)."""
    size, dtype = out_info(meta)
    power = ir.Op("pow", (const(2.0, dtype), operand(other, size, dtype)), dtype)
    return IndexFunction(size, dtype, ir.Op("mul", (operand(x, size, dtype), power), dtype))


@register(aten.round.decimals)
def round_decimals(ctx, meta, x, *, decimals=0):
    """ATen's round_decimals: nearbyint(x * 10**d) / 10**d, or for d < 0 nearbyint(x / 10**-d) * 10**-d, in
    the op-math type (float32 for half types: one rounding at the end, as eager's kernel)."""
    size, dtype = out_info(meta)
    if not dtype.is_floating_point:
        raise Unsupported("round with decimals of an integer tensor")
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    scale = const(10.0 ** abs(decimals), compute)
    inward, outward = ("truediv", "mul") if decimals < 0 else ("mul", "truediv")
    scaled = ir.Op(inward, (operand(x, size, compute), scale), compute)
    body = ir.Op(outward, (ir.Op("round", (scaled,), compute), scale), compute)
    return IndexFunction(size, dtype, cast(body, dtype))


@register(aten.special_zeta.default)
def zeta(ctx, meta, x, q):
    """The Hurwitz zeta function of the order `x` and the shift `q`, in the result dtype as ATen's kernel."""
    size, dtype = out_info(meta)
    if not dtype.is_floating_point:
        raise Unsupported(f"zeta in {dtype}")
    return IndexFunction(size, dtype, _zeta(operand(x, size, dtype), operand(q, size, dtype), dtype))


def _zeta(x: ir.Expr, q: ir.Expr, dtype: torch.dtype) -> ir.Expr:
    if isinstance(q, ir.Const):  # the Triton helper takes its shape from q: a literal has none
        raise Unsupported("zeta of a constant shift")
    return ir.Op("zeta", (x, q), dtype)


@register(aten.polygamma.default)
def polygamma(ctx, meta, n, x):
    """polygamma(0, x) is digamma, polygamma(1, x) trigamma (the gradients of lgamma and digamma); a higher order is
    (-1)^(n+1) n! zeta(n + 1, x), with n! as ATen's kernel computes it (exp(lgamma(n + 1)), in the result dtype).
    The order is the schema's `int`: tracing specializes it, under dynamic shapes too."""
    size, dtype = out_info(meta)
    if not dtype.is_floating_point or n < 0:
        raise Unsupported(f"polygamma of order {n} in {dtype}")  # a negative order: ATen raises eager's error
    x = operand(x, size, dtype)
    if n <= 1:
        return IndexFunction(size, dtype, ir.Op("digamma" if n == 0 else "trigamma", (x,), dtype))
    sign = const(1 if n % 2 else -1, dtype)
    factorial = ir.Op("exp", (ir.Op("lgamma", (const(n + 1, dtype),), dtype),), dtype)
    body = ir.Op("mul", (ir.Op("mul", (sign, factorial), dtype), _zeta(const(n + 1, dtype), x, dtype)), dtype)
    return IndexFunction(size, dtype, body)
