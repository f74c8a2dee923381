"""Tables that map the IR to Triton: dtypes, elementwise ops, reductions.

Kept as data (one entry per IR op name) so the kernel generator has no
per-op branches. `{0}`, `{1}`, `{2}` are the emitted arguments; `{T}` is the
Triton compute type of the first argument (`{T}` of `where` is its result).
Functions named `libdevice.*` come from `triton.language.extra.libdevice` on
the GPU and from `kiln.codegen.triton.interp_libdevice` (numpy) under
`TRITON_INTERPRET=1`; `kiln_*` helpers live in `kiln.codegen.triton.helpers`.
"""
from __future__ import annotations

import math

import torch

from kiln.lower import ir

# torch dtype -> Triton type of the values in memory.
STORAGE = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
           torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
           torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1"}

# torch dtype -> Triton type values are computed in: half types in float32, as eager's kernels do.
COMPUTE = {**STORAGE, torch.float16: "tl.float32", torch.bfloat16: "tl.float32"}

# Reduced-precision dtypes: eager rounds each op's result to them, so kernels do too.
ROUNDED = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16"}

# exp, sigmoid and true division as eager's CUDA kernels compute them (CUDA's expf, IEEE division): Triton's
# tl.exp, tl.sigmoid and `/` are approximations some ulps away, which a half-type result's rounding or a value's
# bits seen through a view make visible (benchmarks/results/triton_math).
OPS = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "libdevice.div_rn({0}, {1})",
    "floordiv": "kiln_floordiv({0}, {1})", "truncdiv": "kiln_truncdiv({0}, {1})",
    "mod": "kiln_pymod({0}, {1})", "fmod": "kiln_fmod({0}, {1})", "neg": "kiln_neg({0})",
    "abs": "tl.abs({0})", "sign": "kiln_sign({0})", "pow": "kiln_pow({0}, {1} + tl.zeros_like({0}))",
    "exp": "libdevice.exp({0})", "exp2": "tl.exp2({0})", "log": "tl.log({0})", "log2": "tl.log2({0})",
    "log10": "libdevice.log10({0})", "log1p": "libdevice.log1p({0})", "expm1": "libdevice.expm1({0})",
    "sqrt": "libdevice.sqrt({0})", "rsqrt": "libdevice.rsqrt({0})", "reciprocal": "kiln_reciprocal({0})",
    "sigmoid": "kiln_sigmoid({0})", "tanh": "libdevice.tanh({0})",
    "erf": "libdevice.erf({0})", "erfc": "libdevice.erfc({0})", "lgamma": "libdevice.lgamma({0})",
    "sin": "tl.sin({0})", "cos": "tl.cos({0})", "tan": "libdevice.tan({0})",
    "asin": "libdevice.asin({0})", "acos": "libdevice.acos({0})", "atan": "libdevice.atan({0})",
    "sinh": "libdevice.sinh({0})", "cosh": "libdevice.cosh({0})", "asinh": "libdevice.asinh({0})",
    "acosh": "libdevice.acosh({0})", "atanh": "libdevice.atanh({0})", "atan2": "libdevice.atan2({0}, {1})",
    "floor": "libdevice.floor({0})", "ceil": "libdevice.ceil({0})", "round": "libdevice.nearbyint({0})",
    "trunc": "libdevice.trunc({0})",
    "maximum": "kiln_pointwise_maximum({0}, {1})", "minimum": "kiln_pointwise_minimum({0}, {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "(({0} != 0) & ({1} != 0))",
    "logical_or": "(({0} != 0) | ({1} != 0))", "logical_xor": "(({0} != 0) ^ ({1} != 0))",
    "logical_not": "({0} == 0)", "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})",
    "bitwise_xor": "({0} ^ {1})", "bitwise_not": "kiln_bitwise_not({0})", "lshift": "({0} << {1})",
    "rshift": "({0} >> {1})", "isnan": "({0} != {0})", "isinf": "(tl.abs({0}) == float('inf'))",
    "where": "tl.where({0}, {1}, {2})",
    # the check itself is emitted before (TritonKernel._checks): an index out of range reads address 0
    "check_index": "tl.where(({0} < 0) | ({0} >= {1}), 0, {0})",
    "copysign": "libdevice.copysign({0}, {1})", "hypot": "libdevice.hypot({0}, {1})",
    "fma": "libdevice.fma({0}, {1}, {2})",
    "nextafter": "libdevice.nextafter({0}, {1})", "digamma": "kiln_digamma({0})", "trigamma": "kiln_trigamma({0})",
    "zeta": "kiln_zeta({0} + tl.zeros_like({1}), {1})",  # q is never a literal (kiln/lower/ops/pointwise.py `zeta`)
}
assert set(OPS) | {"cast"} >= ir.OP_NAMES, ir.OP_NAMES - set(OPS)
# Ops printed as Python operators, which take a Python scalar operand; the others are calls (helpers, libdevice).
INFIX = {name for name, template in OPS.items() if template.startswith("(")}
# libdevice functions of two operands: a literal operand must be a block of its dtype (libdevice takes a Python float
# as float32, and has no float64 function of a float32 operand)
LIBDEVICE_BINARY = {name for name, template in OPS.items() if template.startswith("libdevice.") and "{1}" in template}


def to_half(code: str, dtype: torch.dtype) -> str:
    """Round a float value to a half type, nearest-even (`kiln_to_bf16`: the interpreter's own bf16 cast truncates)."""
    return f"kiln_to_bf16({code})" if dtype == torch.bfloat16 else f"{code}.to(tl.float16)"


# Negative zero, made from its bits at run time: Triton makes every constant equal to 0 its +0.0 (a literal -0.0,
# or float('-0.0'), multiplies as +0.0, on the GPU and in the interpreter), where eager's -0.0 * 2 is -0.0.
NEGATIVE_ZERO = {torch.float64: "tl.cast(-9223372036854775808, tl.float64, bitcast=True)",
                 torch.float32: "tl.cast(-2147483648, tl.float32, bitcast=True)"}


def literal(value, dtype: torch.dtype) -> str:
    """A Python literal Triton reads as a scalar of (roughly) `dtype`'s compute type (negative zero: a scalar made
    from its bits, `NEGATIVE_ZERO`)."""
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return "float('nan')"
        if math.isinf(v):
            return "float('inf')" if v > 0 else "float('-inf')"
        if v == 0 and math.copysign(1.0, v) < 0:
            return NEGATIVE_ZERO[torch.float64 if dtype == torch.float64 else torch.float32]
        return repr(v)
    return str(int(value))


def lowest(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "float('-inf')"
    if dtype == torch.bool:
        return "0"
    return str(torch.iinfo(dtype).min)


def highest(dtype: torch.dtype) -> str:
    if dtype.is_floating_point:
        return "float('inf')"
    if dtype == torch.bool:
        return "1"
    return str(torch.iinfo(dtype).max)


def identity(rtype: str, dtype: torch.dtype) -> str:
    """The value masked-out lanes contribute to a reduction (so tails change nothing)."""
    return {"sum": "0", "prod": "1", "any": "0", "max": lowest(dtype), "min": highest(dtype),
            "argmax": lowest(dtype), "argmin": highest(dtype),
            "welford_mean": "0", "welford_m2": "0"}[rtype]


# Reductions over axis 1 of an [XBLOCK, RBLOCK] block of values `{v}` -> [XBLOCK] (see helpers.py).
REDUCE_BLOCK = {
    "sum": "tl.sum({v}, 1)",
    "prod": "tl.reduce({v}, 1, kiln_prod_combine)",
    "max": "tl.reduce({v}, 1, kiln_maximum)",
    "min": "tl.reduce({v}, 1, kiln_minimum)",
    "any": "(tl.max({v}.to(tl.int8), 1) != 0)",
}
# Elementwise accumulation of a looped reduction: acc = combine(acc, v) lane by lane.
ACCUMULATE = {
    "sum": "{a} + {v}",
    "prod": "{a} * {v}",
    "max": "kiln_maximum({a}, {v})",
    "min": "kiln_minimum({a}, {v})",
    "any": "{a} | ({v} != 0)",
}
