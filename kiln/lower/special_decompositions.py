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
    **{op: replication_pad_backward_as_index_adds for op in (
        aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
        aten.replication_pad3d_backward.default)},
}
