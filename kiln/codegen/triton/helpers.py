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
    """eager's maximum, clamp and relu: NaN wins, and of equal values (0.0 and -0.0) the first. Selections nest
    rather than AND comparisons: under the interpreter a 0-dim tensor's comparison ANDed with a block's is
    refused."""
    return tl.where(a != a, a, tl.where(b != b, b, tl.where(a < b, b, a)))


@triton.jit
def kiln_pointwise_minimum(a, b):
    return tl.where(a != a, a, tl.where(b != b, b, tl.where(b < a, b, a)))


@triton.jit
def kiln_to_bf16(x):
    return x.to(tl.bfloat16)


@triton.jit
def kiln_prod_combine(a, b):
    return a * b


@triton.jit
def kiln_reciprocal(x):
    """`1 / x` correctly rounded, as eager's CUDA kernel divides; the 1 in x's dtype (a float64 x takes no
    float32 literal in libdevice's division)."""
    return libdevice.div_rn(tl.full([], 1.0, x.dtype), x)


@triton.jit
def kiln_sigmoid(x):
    """Eager's CUDA sigmoid, `1 / (1 + exp(-x))` with CUDA's expf and a correctly rounded division."""
    return kiln_reciprocal(1.0 + libdevice.exp(-x))


@triton.jit
def kiln_floordiv(a, b):
    if a.dtype.is_floating():  # eager's div_floor_floating: floor(a / b) rounds 1 // 0.1 up to 10
        mod = libdevice.fmod(a, b)
        div = libdevice.div_rn(a - mod, b)
        div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
        floor = libdevice.floor(div)
        floor = tl.where(div - floor > 0.5, floor + 1.0, floor)
        quotient = libdevice.div_rn(a, b)
        return tl.where(b == 0, quotient, tl.where(div == 0, libdevice.copysign(0.0 * a, quotient), floor))
    else:
        q = a // b
        r = a - q * b
        return tl.where((r != 0) & ((r < 0) != (b < 0)), q - 1, q)


@triton.jit
def kiln_truncdiv(a, b):
    if a.dtype.is_floating():
        return libdevice.trunc(libdevice.div_rn(a, b))
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
    """Chan et al.'s merge of two (mean, M2, count) partials. An empty partial (count 0) merges as a no-op, chosen
    rather than computed: the formula's `delta * delta * 0` is NaN where delta squared overflows (a mean near 1e30
    merged with an empty lane's 0), where eager's merge skips the empty side."""
    w = w_a + w_b
    frac = tl.where(w == 0, 0.0, w_b / tl.where(w == 0, 1.0, w))
    delta = mean_b - mean_a
    mean = tl.where(w_b == 0, mean_a, tl.where(w_a == 0, mean_b, mean_a + delta * frac))
    m2 = tl.where(w_b == 0, m2_a, tl.where(w_a == 0, m2_b, m2_a + m2_b + delta * delta * w_a * frac))
    return mean, m2, w


@triton.jit
def kiln_welford_update(mean, m2, w, x, mask):
    """One lane of a looped Welford: add `x` where `mask` holds."""
    w_new = tl.where(mask, w + 1.0, w)
    delta = x - mean
    mean_new = tl.where(mask, mean + delta / tl.where(w_new == 0, 1.0, w_new), mean)
    m2_new = tl.where(mask, m2 + delta * (x - mean_new), m2)
    return mean_new, m2_new, w_new


@triton.jit
def kiln_digamma(x):
    """ATen's calc_digamma (Cephes): the reflection below 0 (its tangent in float64, of the fraction), the
    recurrence up to 10, then the asymptotic series; each branch computed and selected, lane by lane. Constants
    are made in x's dtype: a Python float literal is a float32 in a Triton kernel, too coarse for float64."""
    negative = x < 0
    xd = x.to(tl.float64)
    pi = tl.full([], 3.14159265358979323846, tl.float64)
    reflection = (pi / libdevice.tan(pi * (xd - libdevice.trunc(xd)))).to(x.dtype)
    y = tl.where(negative, 1.0 - x, x)
    result = tl.zeros_like(x)
    for _ in tl.static_range(10):  # y > 0 here, so ten steps reach 10
        below = y < 10.0
        result = tl.where(below, result - 1.0 / y, result)
        y = tl.where(below, y + 1.0, y)
    z = 1.0 / (y * y)
    poly = tl.zeros_like(x) + tl.full([], 8.33333333333333333333E-2, x.dtype)
    poly = poly * z + tl.full([], -2.10927960927960927961E-2, x.dtype)
    poly = poly * z + tl.full([], 7.57575757575757575758E-3, x.dtype)
    poly = poly * z + tl.full([], -4.16666666666666666667E-3, x.dtype)
    poly = poly * z + tl.full([], 3.96825396825396825397E-3, x.dtype)
    poly = poly * z + tl.full([], -8.33333333333333333333E-3, x.dtype)
    poly = poly * z + tl.full([], 8.33333333333333333333E-2, x.dtype)
    series = tl.where(y < 1.0e17, z * poly, 0.0)
    psi_10 = tl.full([], 2.25175258906672110764, x.dtype)
    out = tl.where(y == 10.0, result + psi_10, result + tl.log(y) - 0.5 / y - series)
    # selections nest (no `&` of two comparisons: a 0-dim operand's under the interpreter is refused)
    out = tl.where(negative, tl.where(x == libdevice.trunc(x), float("nan"), out - reflection), out)
    return tl.where(x == 0, libdevice.copysign(float("inf") + tl.zeros_like(x), x * -1.0), out)  # -(0.0) is -0.0


@triton.jit
def kiln_trigamma(x):
    """ATen's trigamma: the reflection below 0.5, six steps of the recurrence, then the asymptotic series
    (constants in x's dtype, as in kiln_digamma)."""
    pi = tl.full([], 3.14159265358979323846, x.dtype)
    reflect = x < 0.5
    s = libdevice.sin(pi * x)  # in x's precision (tl.sin of float64 is float32's under the interpreter)
    result = tl.where(reflect, -(pi * pi) / (s * s), tl.zeros_like(x))
    y = tl.where(reflect, 1.0 - x, x)
    for _ in tl.static_range(6):
        result = result + 1.0 / (y * y)
        y = y + 1.0
    ixx = 1.0 / (y * y)
    sixth, thirtieth = tl.full([], 1.0 / 6.0, x.dtype), tl.full([], 1.0 / 30.0, x.dtype)
    series = ixx * (sixth - ixx * (thirtieth - ixx * tl.full([], 1.0 / 42.0, x.dtype)))
    result = result + (1.0 + 1.0 / (2.0 * y) + series) / y
    return tl.where(reflect, -result, result)


@triton.jit
def _zeta_tail_step(s, rising, term, k, w, x, coefficient: tl.constexpr, eps, done, result):
    """One term of zeta's Euler-Maclaurin tail (kiln_zeta): a lane whose term falls below eps * sum is done. The
    coefficient is a constexpr, so that it is made in float64 exactly (a plain float argument is a float32)."""
    rising = rising * (x + k)
    term = term / w
    t = rising * term / tl.full([], coefficient, tl.float64)
    s = s + t
    small = tl.where(-eps * s < tl.abs(t), tl.where(tl.abs(t) < eps * s, 1, 0), 0)
    result = tl.where(done == 0, tl.where(small == 1, s, result), result)
    done = tl.where(small == 1, 1, done)
    rising = rising * (x + k + 1.0)
    return s, rising, term / w, k + 2.0, done, result


@triton.jit
def kiln_zeta(x, q):
    """ATen's CPU zeta (Cephes, as prelude.h's kiln::zeta): the first term a power in x's dtype, the rest summed in
    float64, directly until q + k passes 9 (a loop that runs while any lane still sums: a negative q takes more
    steps), then the Euler-Maclaurin tail; a lane stops where its term falls below eps * sum. Flags are ints and
    selections nest (no `&` of comparisons: a 0-dim operand's under the interpreter is refused)."""
    eps = tl.full([], 1.11022302462515654042E-16, tl.float64)
    xd = x.to(tl.float64)
    floor_q = libdevice.floor(q)
    special = tl.where(x == 1.0, float("inf"), tl.where(x < 1.0, float("nan"),
                                                         tl.where(q == floor_q, float("inf"), float("nan"))))
    done = tl.where(x == 1.0, 1, tl.where(x < 1.0, 1, tl.where(
        q <= 0.0, tl.where(q == floor_q, 1, tl.where(x != libdevice.floor(x), 1, 0)), 0)))
    result = special.to(tl.float64) + tl.zeros_like(xd)
    s = libdevice.pow(q, -x).to(tl.float64)
    a = q.to(tl.float64)
    term = tl.zeros_like(xd)
    i = 0
    active = tl.where(done == 0, 1, 0)
    while tl.max(active, axis=None) > 0:
        a = tl.where(active == 1, a + 1.0, a)
        term = tl.where(active == 1, libdevice.pow(a, -xd), term)
        s = tl.where(active == 1, s + term, s)
        small = tl.where(-eps * s < term, tl.where(term < eps * s, 1, 0), 0)
        finished = tl.where(active == 1, small, 0)
        result = tl.where(finished == 1, s, result)
        done = tl.where(finished == 1, 1, done)
        i += 1
        active = tl.where(done == 0, tl.where(i < 9, 1, tl.where(a <= 9.0, 1, 0)), 0)
    w = a
    s = s + term * w / (xd - 1.0)
    s = s - 0.5 * term
    rising = tl.zeros_like(xd) + 1.0
    k = tl.zeros_like(xd)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, 12.0, eps, done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, -720.0, eps, done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, 30240.0, eps, done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, -1209600.0, eps, done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, 47900160.0, eps, done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, -1.8924375803183791606e9, eps,
                                                       done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, 7.47242496e10, eps, done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, -2.950130727918164224e12, eps,
                                                       done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, 1.1646782814350067249e14, eps,
                                                       done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, -4.5979787224074726105e15, eps,
                                                       done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, 1.8152105401943546773e17, eps,
                                                       done, result)
    s, rising, term, k, done, result = _zeta_tail_step(s, rising, term, k, w, xd, -7.1661652561756670113e18, eps,
                                                       done, result)
    return tl.where(done == 0, s, result).to(x.dtype)

__all__ += [name for name in list(globals()) if name.startswith("kiln_")]
# interpreter-only replacements of builtins the kernels use (see libdevice.py); none on the GPU
globals().update(OVERRIDES)
__all__ += list(OVERRIDES)
