"""Layer norm and group norm on the CPU: the rows whose statistics eager's kernel makes NaN.

Eager's CPU layer norm and (contiguous) group norm compute each row's mean and variance with ATen's
`RowwiseMoments`: a Welford pass per lane of a vector over the row's first `n * W` elements (W elements per vector
load), a scalar Welford pass over the `N % W` left, then the lanes merged into the scalar one by one
(`AddMoments`), each merge adding `delta * delta * c * count` to the sum of squares. Where one side of a merge is
empty, the product is `delta² * 0`, and once `delta²` overflows (|delta| above the square root of the dtype's
largest value) it is `inf * 0`: NaN, and the row's rstd and every output of the row are NaN. That happens

- in a row shorter than a vector (`N < W`, no lanes): delta is the row's mean;
- in a row of whole vectors (`N % W == 0`, no scalar tail): delta is the first lane's mean, the mean of the
  elements at positions `0, L, 2L, ...` (L: the accumulator's lanes; half types accumulate in float, two float
  vectors per loaded vector).

kiln's two-pass statistics give such a row an infinite variance, rstd 0, and outputs equal to the bias (or 0).
These rules add eager's NaN to the decomposition; rows of other lengths, where each merge has two non-empty sides,
only overflow to infinity in either. W and L are those of ATen's AVX2 and default (scalar) builds, which measure the
same on an AVX-512 CPU: 8 floats, 4 doubles, 16 bf16/fp16 loads accumulated as 8 floats.
"""
from __future__ import annotations

import math

import torch

# dtype -> (elements per vector load W, accumulator lanes L)
_LANES = {torch.float32: (8, 8), torch.float64: (4, 4), torch.bfloat16: (16, 8), torch.float16: (16, 8)}


def nan_rows(rows: torch.Tensor) -> torch.Tensor | None:
    """Per row of `rows` (..., N), as eager's kernel reads them: does eager's merge make its statistics NaN? None
    where no row can (a length with a scalar tail and lanes, a symbolic length, a dtype without the rule)."""
    length = rows.shape[-1]
    lanes = _LANES.get(rows.dtype)
    if lanes is None or not isinstance(length, int) or length == 0:
        return None
    width, accumulators = lanes
    compute = torch.float32 if rows.dtype in (torch.bfloat16, torch.float16) else rows.dtype
    values = rows.to(compute)
    if length < width:  # no lanes: the scalar mean meets the empty lanes
        mean = values.mean(-1)
    elif length % width == 0:  # no tail: the first lane meets the empty scalar side
        # L is a power of two: a mask of the position's low bits, which vectorizes where a modulo would not
        positions = torch.arange(length, dtype=torch.int32, device=rows.device)  # 32-bit lanes: as wide as floats
        first_lane = torch.bitwise_and(positions, accumulators - 1) == 0
        mean = torch.where(first_lane, values, 0).sum(-1) / (length // accumulators)
    else:
        return None
    return ~torch.isfinite(mean * mean)


def layer_norm_as_eager(decompose):
    """`aten.native_layer_norm` as `decompose` (torch's decomposition) computes it, with the rows eager's CPU kernel
    makes NaN (`nan_rows`) NaN in the output and rstd; the mean is eager's finite one."""
    def decomposition(input, normalized_shape, weight, bias, eps):
        out, mean, rstd = decompose(input, normalized_shape, weight, bias, eps)
        if input.device.type != "cpu":
            return out, mean, rstd
        length = math.prod(normalized_shape)
        nan = nan_rows(input.reshape(-1, length)) if isinstance(length, int) else None
        if nan is None:
            return out, mean, rstd
        nan = nan.reshape(rstd.shape)
        return _nan_where(nan, out), mean, _nan_where(nan, rstd)
    return decomposition


def group_norm_as_eager(decompose):
    """`aten.native_group_norm` as `decompose` computes it, with the groups eager's CPU kernel makes NaN
    (`nan_rows` over each group's channels, in contiguous order) NaN in the output and rstd. Channels-last input
    runs another eager kernel, which this rule does not describe: decomposed as it is."""
    def decomposition(input, weight, bias, batch, channels, spatial, groups, eps):
        out, mean, rstd = decompose(input, weight, bias, batch, channels, spatial, groups, eps)
        if input.device.type != "cpu" or _channels_last(input):
            return out, mean, rstd
        nan = nan_rows(input.reshape(batch, groups, -1))
        if nan is None:
            return out, mean, rstd
        grouped = out.reshape(batch, groups, -1)
        return _nan_where(nan.unsqueeze(-1), grouped).reshape(out.shape), mean, _nan_where(nan, rstd)
    return decomposition


def _nan_where(mask: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, torch.full((), math.nan, dtype=values.dtype, device=values.device), values)


def _channels_last(t: torch.Tensor) -> bool:
    """Does eager's group norm take `t` as channels-last (its `suggest_memory_format`)?"""
    formats = {4: torch.channels_last, 5: torch.channels_last_3d}
    return t.dim() in formats and not t.is_contiguous() and t.is_contiguous(memory_format=formats[t.dim()])
