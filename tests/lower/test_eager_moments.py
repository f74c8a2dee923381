"""Norms over rows whose squares overflow: NaN where eager's CPU kernel makes NaN, and only there
(kiln/lower/eager_moments.py).

Eager's CPU layer norm and group norm merge per-lane Welford statistics; a merge with an empty side multiplies an
overflowed square by a zero count, which is NaN, in rows shorter than a vector (their mean's square overflows) and
in rows of whole vectors (their first lane's). Other lengths overflow to an infinite variance, rstd 0 and outputs
equal to the bias, as kiln's do. Batch norm (a sum, then squared deviations) and RMS norm (a mean of squares) have
no merge: an overflow is infinite in eager and in kiln. Forward and backward, both code generators.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from support.triton_device import DEVICE, INTERPRETING

TARGETS = [None, pytest.param({"cpu_backend": "triton"}, marks=pytest.mark.skipif(
    DEVICE != "cpu" or not INTERPRETING, reason="Triton kernels over CPU tensors need TRITON_INTERPRET=1"))]
# above the square root of float32's largest value (1.8e19): a square overflows
HUGE = 1e21


def rows_with_huge_values(length: int, positions: list[int | None], dtype=torch.float32, huge=HUGE) -> torch.Tensor:
    """One row per entry of `positions`: random values, and `huge` at that position (None: none)."""
    x = torch.randn(len(positions), length, generator=torch.Generator().manual_seed(length), dtype=torch.float64)
    for row, position in enumerate(positions):
        if position is not None:
            x[row, position] = huge
    return x.to(dtype)


def assert_as_eager(fn, x: torch.Tensor, options=None, backward: bool = True):
    """`fn(x)` and, where `backward`, the gradients of its sum: eager's NaN positions, eager's values elsewhere."""
    kiln.reset()
    x_eager, x_kiln = x.clone().requires_grad_(backward), x.clone().requires_grad_(backward)
    expected, got = fn(x_eager), kiln.compile(fn, options=options)(x_kiln)
    assert torch.equal(expected.isnan(), got.isnan()), f"NaN: eager {expected.isnan().sum()}, kiln {got.isnan().sum()}"
    torch.testing.assert_close(got, expected, equal_nan=True)
    if backward:
        expected.sum().backward()
        got.sum().backward()
        assert torch.equal(x_eager.grad.isnan(), x_kiln.grad.isnan())
        torch.testing.assert_close(x_kiln.grad, x_eager.grad, equal_nan=True)


def layer_norm(x):
    return F.layer_norm(x, x.shape[-1:])


def affine_layer_norm(x):
    weight = torch.linspace(0.5, 2.0, x.shape[-1], dtype=x.dtype)
    bias = torch.linspace(-1.0, 1.0, x.shape[-1], dtype=x.dtype)
    return F.layer_norm(x, x.shape[-1:], weight, bias)


# (row length, where the huge value goes in each row): eager's NaN rows are those of a short row, and those of a row
# of whole vectors whose huge value lies in the first lane (positions 0, 8, 16, ...)
ROWS = {
    "shorter than a vector": (4, [0, 3, None]),
    "whole vectors": (16, [0, 3, 8, None]),
    "with a scalar tail": (17, [0, 3, 16, None]),
    "many chunks": (8 * 16 * 3, [0, 8 * 16 * 2, 5, None]),
}


@pytest.mark.sampled(every=2, classes=("rows", "fn"))
@pytest.mark.parametrize("options", TARGETS, ids=["cpp", "triton"])
@pytest.mark.parametrize("fn", [layer_norm, affine_layer_norm], ids=["plain", "affine"])
@pytest.mark.parametrize("rows", list(ROWS))
def test_layer_norm_over_rows_whose_squares_overflow(rows, fn, options):
    length, positions = ROWS[rows]
    assert_as_eager(fn, rows_with_huge_values(length, positions), options)


@pytest.mark.parametrize("length", [8, 16, 24, 5])
def test_a_constant_huge_row(length):
    """Every square overflows, no deviation does: NaN in rows of whole vectors and in short rows. (With a tail, eager's
    Welford mean of equal values is exact and its output 0; kiln's two-pass mean rounds, and the rounding's deviations
    normalize to about +-1: docs/numerics.md.)"""
    assert_as_eager(layer_norm, torch.full((2, length), 1e20))


@pytest.mark.parametrize("dtype,length,huge", [(torch.float64, 4, 1e160), (torch.float64, 5, 1e160),
                                               (torch.bfloat16, 16, 1e21), (torch.bfloat16, 24, 1e21),
                                               (torch.bfloat16, 8, 1e21)], ids=str)
def test_other_dtypes_have_their_own_vector_width(dtype, length, huge):
    """float64 loads 4 per vector; bf16 loads 16 and accumulates them as two vectors of 8 floats."""
    assert_as_eager(layer_norm, rows_with_huge_values(length, [0, 2, None], dtype, huge))


@pytest.mark.parametrize("options", TARGETS, ids=["cpp", "triton"])
@pytest.mark.parametrize("spatial", [(2, 4), (1, 1)], ids=["groups of whole vectors", "short groups"])
def test_group_norm_over_groups_whose_squares_overflow(spatial, options):
    x = torch.randn(2, 4, *spatial, generator=torch.Generator().manual_seed(0))
    x[0, 0, 0, 0] = HUGE  # the first lane of group 0
    x[1, 2].view(-1)[-1] = HUGE  # the last element of group 1: in no lane's first position when groups are long
    assert_as_eager(lambda t: F.group_norm(t, 2), x, options)


@pytest.mark.parametrize("fn", [lambda x: F.batch_norm(x, None, None, training=True),
                                lambda x: F.rms_norm(x, x.shape[-1:]),
                                lambda x: x.var(-1) + x.mean(-1)], ids=["batch_norm", "rms_norm", "var_mean"])
def test_norms_without_a_merge_overflow_to_infinity_alike(fn):
    assert_as_eager(fn, rows_with_huge_values(16, [0, 3, None]))
