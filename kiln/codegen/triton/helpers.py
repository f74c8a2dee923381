"""@triton.jit helpers the generated kernels call (imported into every kernel module).

They exist where Triton's own ops differ from eager's semantics: Python-style
floor division and modulo (Triton's `//` and `%` truncate like C; a float floor
division is eager's div_floor, not floor(a / b)),
NaN-propagating max/min (eager's `maximum` returns NaN if either side is), and
the combine functions of argmax/argmin (first index wins ties, NaN is the max)
and Welford variance (merging per-lane partial means and M2).
"""
from __future__ import annotations

import triton
import triton.language as tl

from kiln.codegen.triton.libdevice import OVERRIDES, libdevice

__all__ = ["libdevice"]  # extended below with every kiln_* helper


@triton.jit
def kiln_maximum(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def kiln_minimum(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def kiln_pointwise_maximum(a, b):
    """eager's maximum, clamp and relu: NaN wins, and of equal values (0.0 and -0.0) the first."""
    return tl.where((a != a) | ((b == b) & ~(a < b)), a, b)


@triton.jit
def kiln_pointwise_minimum(a, b):
    return tl.where((a != a) | ((b == b) & ~(b < a)), a, b)


@triton.jit
def kiln_to_bf16(x):
    return x.to(tl.bfloat16)


@triton.jit
def kiln_prod_combine(a, b):
    return a * b


@triton.jit
def kiln_floordiv(a, b):
    if a.dtype.is_floating():  # eager's div_floor_floating: floor(a / b) rounds 1 // 0.1 up to 10
        mod = libdevice.fmod(a, b)
        div = (a - mod) / b
        div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
        floor = libdevice.floor(div)
        floor = tl.where(div - floor > 0.5, floor + 1.0, floor)
        return tl.where(b == 0, a / b, tl.where(div == 0, libdevice.copysign(0.0 * a, a / b), floor))
    else:
        q = a // b
        r = a - q * b
        return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def kiln_truncdiv(a, b):
    if a.dtype.is_floating():
        return libdevice.trunc(a / b)
    else:
        return a // b


@triton.jit
def kiln_fmod(a, b):
    if a.dtype.is_floating():
        return libdevice.fmod(a, b)
    else:
        return a % b


@triton.jit
def kiln_pymod(a, b):
    r = kiln_fmod(a, b)
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def kiln_neg(x):
    """-x with eager's signed zero: Triton's negation is 0 - x, which makes -(0.0) 0.0."""
    if x.dtype.is_floating():
        return x * -1.0
    else:
        return -x


@triton.jit
def kiln_sign(x):
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


@triton.jit
def kiln_pow(a, b):
    if a.dtype.is_floating():
        return libdevice.pow(a, b.to(a.dtype))
    else:  # exactly, wrapping on overflow as eager does (a float64 pow rounds and saturates)
        result = (b * 0 + 1).to(a.dtype)
        base = a
        e = b
        for _ in tl.static_range(64):
            result = tl.where((e & 1) != 0, result * base, result)
            base = base * base
            e = e >> 1
        negative = tl.where(a == 1, 1, tl.where(a == -1, tl.where((b & 1) != 0, -1, 1), 0)).to(a.dtype)
        return tl.where(b < 0, negative, result)


@triton.jit
def kiln_bitwise_not(x):
    if x.dtype == tl.int1:
        return x == 0
    else:
        return ~x


@triton.jit
def kiln_argmax_combine(a, ia, b, ib):
    """(value, index) of the larger of two candidates; NaN is larger than anything, ties keep the first index."""
    a_nan = a != a
    b_nan = b != b
    gt = (a > b) | (a_nan & ~b_nan)
    eq = (a == b) | (a_nan & b_nan)
    pick_a = gt | (eq & (ia < ib))
    return tl.where(pick_a, a, b), tl.where(pick_a, ia, ib)


@triton.jit
def kiln_argmin_combine(a, ia, b, ib):
    a_nan = a != a
    b_nan = b != b
    lt = (a < b) | (a_nan & ~b_nan)
    eq = (a == b) | (a_nan & b_nan)
    pick_a = lt | (eq & (ia < ib))
    return tl.where(pick_a, a, b), tl.where(pick_a, ia, ib)


@triton.jit
def kiln_welford_combine(mean_a, m2_a, w_a, mean_b, m2_b, w_b):
    """Chan et al.'s merge of two (mean, M2, count) partials; empty partials (count 0) merge as no-ops."""
    w = w_a + w_b
    frac = tl.where(w == 0, 0.0, w_b / tl.where(w == 0, 1.0, w))
    delta = mean_b - mean_a
    return mean_a + delta * frac, m2_a + m2_b + delta * delta * w_a * frac, w


@triton.jit
def kiln_welford_update(mean, m2, w, x, mask):
    """One lane of a looped Welford: add `x` where `mask` holds."""
    w_new = tl.where(mask, w + 1.0, w)
    delta = x - mean
    mean_new = tl.where(mask, mean + delta / tl.where(w_new == 0, 1.0, w_new), mean)
    m2_new = tl.where(mask, m2 + delta * (x - mean_new), m2)
    return mean_new, m2_new, w_new


__all__ += [name for name in list(globals()) if name.startswith("kiln_")]
# interpreter-only replacements of builtins the kernels use (see libdevice.py); none on the GPU
globals().update(OVERRIDES)
__all__ += list(OVERRIDES)
