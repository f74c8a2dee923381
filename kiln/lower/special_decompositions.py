"""Decompositions of special functions and padding backwards into ops kiln lowers, so that they fuse with
their neighbours where ATen would run each as a kernel of its own (an extern, counted as a fallback).

Each is checked against eager at the OpInfo tolerances (tests/lower/test_special_decompositions.py)."""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten

# From here up erfc(x) nears the smallest normal double and exp(x * x) overflows, so erfcx takes its
# asymptotic series, whose sixth term is below 1e-12 of the first there.
ERFCX_ASYMPTOTIC_FROM = 25.0
_INV_SQRT_PI = 1.0 / math.sqrt(math.pi)


def erfcx_from_erfc(x):
    """erfcx(x) = exp(x^2) erfc(x), the scaled complementary error function.

    Computed in float64 (float32's exp(x^2) overflows from x = 9.4, where erfc(x) is already subnormal):
    the product's relative error is about x^2 ulps of a double, far below float32's and float64's OpInfo
    tolerances for |x| < 25. Above that the asymptotic series 1/(x sqrt(pi)) (1 - 1/(2x^2) + 3/(4x^4) - ...)
    holds to a double's precision; below -26.6 exp(x^2) overflows to inf as ATen's kernel returns. NaN
    takes the series and stays NaN; +inf gives 0, -inf gives inf, as eager."""
    out_dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    wide = x.to(torch.float64)
    direct = torch.exp(_square_as_eager(x, wide)) * torch.special.erfc(wide)
    inv_2x2 = 0.5 / (wide * wide)
    series = 1.0 + inv_2x2 * (-1.0 + inv_2x2 * (3.0 + inv_2x2 * (-15.0 + inv_2x2 * (105.0 - 945.0 * inv_2x2))))
    asymptotic = series * _INV_SQRT_PI / wide
    return torch.where(wide < ERFCX_ASYMPTOTIC_FROM, direct, asymptotic).to(out_dtype)


# Cephes' rational approximations of ndtri (the inverse of the normal distribution function), as ATen's
# kernel evaluates them: R0 = P0 / Q0 in w^2 around the median (w = y - 1/2, |w| < 1/2 - exp(-2)); in the
# tails, in z = 1 / sqrt(-2 log y), R1 = P1 / Q1 where 1/z < 8 and R2 = P2 / Q2 beyond. Highest power first;
# each Q's leading coefficient, 1, is left out.
NDTRI_P0 = (-5.99633501014107895267E1, 9.80010754185999661536E1, -5.66762857469070293439E1,
            1.39312609387279679503E1, -1.23916583867381258016E0)
NDTRI_Q0 = (1.95448858338141759834E0, 4.67627912898881538453E0, 8.63602421390890590575E1,
            -2.25462687854119370527E2, 2.00260212380060660359E2, -8.20372256168333339912E1,
            1.59056225126211695515E1, -1.18331621121330003142E0)
NDTRI_P1 = (4.05544892305962419923E0, 3.15251094599893866154E1, 5.71628192246421288162E1,
            4.40805073893200834700E1, 1.46849561928858024014E1, 2.18663306850790267539E0,
            -1.40256079171354495875E-1, -3.50424626827848203418E-2, -8.57456785154685413611E-4)
NDTRI_Q1 = (1.57799883256466749731E1, 4.53907635128879210584E1, 4.13172038254672030440E1,
            1.50425385692907503408E1, 2.50464946208309415979E0, -1.42182922854787788574E-1,
            -3.80806407691578277194E-2, -9.33259480895457427372E-4)
NDTRI_P2 = (3.23774891776946035970E0, 6.91522889068984211695E0, 3.93881025292474443415E0,
            1.33303460815807542389E0, 2.01485389549179081538E-1, 1.23716634817820021358E-2,
            3.01581553508235416007E-4, 2.65806974686737550832E-6, 6.23974539184983293730E-9)
NDTRI_Q2 = (6.02427039364742014255E0, 3.67983563856160859403E0, 1.37702099489081330271E0,
            2.16236993594496635890E-1, 1.34204006088543189037E-2, 3.28014464682127739104E-4,
            2.89247864745380683936E-6, 6.79019408009981274425E-9)
_EXP_MINUS_2 = math.exp(-2.0)


def _polynomial(x, coefficients, monic=False):
    """Horner's rule, highest power first; `monic`: a leading coefficient of 1 before `coefficients`."""
    total = x + coefficients[0] if monic else torch.full_like(x, coefficients[0])
    for c in coefficients[1:]:
        total = total * x + c
    return total


def ndtri_rational(p):
    """ndtri(p): the x with Phi(x) = p, by Cephes' approximations in float64 (ATen evaluates them in the
    input's type; float64 rounds to within float32's tolerance of it). Outside [0, 1] and for NaN the
    result is NaN, at 0 and 1 -inf and inf, as eager. Each branch is computed everywhere and `where` keeps
    one (the tails' log of a central p is finite; the others' NaNs are dropped)."""
    out_dtype = p.dtype if p.dtype.is_floating_point else torch.get_default_dtype()
    y0 = p.to(torch.float64)
    w = y0 - 0.5
    w2 = w * w
    central = (w + w * (w2 * _polynomial(w2, NDTRI_P0) / _polynomial(w2, NDTRI_Q0, monic=True))) * math.sqrt(
        2 * math.pi)
    upper = y0 > 1.0 - _EXP_MINUS_2
    y = torch.where(upper, 1.0 - y0, y0)
    x = torch.sqrt(-2.0 * torch.log(y))
    z = 1.0 / x
    near = z * _polynomial(z, NDTRI_P1) / _polynomial(z, NDTRI_Q1, monic=True)
    far = z * _polynomial(z, NDTRI_P2) / _polynomial(z, NDTRI_Q2, monic=True)
    tail = x - torch.log(x) / x - torch.where(x < 8.0, near, far)
    tail = torch.where(upper, tail, -tail)
    result = torch.where((y0 > _EXP_MINUS_2) & ~upper, central, tail)
    result = torch.where(y0 == 0, -math.inf, torch.where(y0 == 1, math.inf, result))
    return torch.where((y0 < 0) | (y0 > 1), math.nan, result).to(out_dtype)


def _square_as_eager(x, wide):
    """x^2 in double, except where x < 0 for inputs narrower than float64: there ATen's kernel computes
    2 exp(x^2) in float (its opmath type), and exp magnifies the rounding of x^2 (about 4e-6 relative at
    x = -9, above float32's tolerance), so the square is rounded to float as eager rounds it."""
    if x.dtype == torch.float64:
        return wide * wide
    narrow = x.to(torch.float32)
    return torch.where(wide < 0, (narrow * narrow).to(torch.float64), wide * wide)


def replication_pad_backward_as_index_adds(grad_output, input, padding):
    """The gradient of replication padding: each padded dim's gradient slices summed into the input position
    they copy, `clamp(o - pad_before, 0, size - 1)`, one index_add per dim (kiln lowers index_add; ATen's
    backward is an extern). `padding` holds (before, after) pairs from the last dim backwards; a negative
    pad crops, and the same formula then maps each kept output position to its input."""
    grad = grad_output
    for k in range(len(padding) // 2):
        dim = input.dim() - 1 - k
        positions = torch.arange(grad.shape[dim], device=grad.device) - padding[2 * k]
        index = positions.clamp(0, input.shape[dim] - 1)
        sizes = list(grad.shape)
        sizes[dim] = input.shape[dim]
        grad = aten.index_add.default(grad.new_zeros(sizes), dim, index, grad)
    return grad


def _adaptive_windows(out_size, in_size, device):
    """Which inputs each adaptive-pooling output averages, as ATen's kernel picks them: output o covers
    [floor(o * in / out), ceil((o + 1) * in / out)). Returns the (out, in) membership mask and each window's
    length."""
    o = torch.arange(out_size, device=device)
    start = torch.div(o * in_size, out_size, rounding_mode="floor")
    end = torch.div((o + 1) * in_size + out_size - 1, out_size, rounding_mode="floor")
    i = torch.arange(in_size, device=device)
    return (start[:, None] <= i) & (i < end[:, None]), end - start


def adaptive_avg_pool2d_backward_as_sums(grad_output, input):
    """Each input's gradient: the sum, over the output windows holding it, of grad / (window height) / (window
    width), ATen's kernel's terms. Windows overlap where the sizes do not divide, so the sum runs over
    the output positions, first along the width then the height, each a masked reduction (a `where`,
    not a product with a 0/1 matrix, so an inf or NaN gradient reaches only the inputs of its window).
    float32 and float64 only: ATen accumulates a half type's terms in its own precision, an order the sums
    would not follow."""
    if grad_output.dtype not in (torch.float32, torch.float64):
        return NotImplemented
    out_h, out_w = grad_output.shape[-2:]
    in_h, in_w = input.shape[-2:]
    mask_h, length_h = _adaptive_windows(out_h, in_h, grad_output.device)
    mask_w, length_w = _adaptive_windows(out_w, in_w, grad_output.device)
    scaled = grad_output / length_h[:, None] / length_w
    zero = grad_output.new_zeros(())
    along_w = torch.where(mask_w, scaled[..., None], zero).sum(-2)  # (.., out_h, in_w)
    return torch.where(mask_h[:, :, None], along_w[..., None, :], zero).sum(-3).to(input.dtype)


SPECIAL_DECOMPOSITIONS = {
    aten._adaptive_avg_pool2d_backward.default: adaptive_avg_pool2d_backward_as_sums,
    aten.special_erfcx.default: erfcx_from_erfc,
    aten.special_ndtri.default: ndtri_rational,
    **{op: replication_pad_backward_as_index_adds for op in (
        aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
        aten.replication_pad3d_backward.default)},
}
