"""A float converted to an integer dtype holds eager's value at every edge: NaN, the infinities, values past the
target's range, negative values into uint8.

C++ leaves such a conversion undefined and the compiler folds what it can see: `maximum` of a NaN made by 0/0 (fuzz
seed 104495) converted to int64 gave 0, eager INT64_MIN. Eager's values (x86-64): truncation into int64 for an
int64 target, into int32 for the narrower ones, NaN and out-of-range values the type's minimum, then the low
bits (NaN to int8 is 0, 300.5 to uint8 is 44, -1.5 to uint8 255). Each source dtype, each target, the values as
inputs (unknown to the compiler) and as NaN and infinities a kernel computes (known to it).
"""
from __future__ import annotations

import pytest
import torch

import kiln

INTEGER_DTYPES = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
EDGES = [float("nan"), float("inf"), -float("inf"), 1e19, -1e19, 9.3e18, 3e9, -3e9, 2.2e9, 70000.5, -70000.5,
         300.7, 255.9, 128.5, -129.5, -1.5, -0.5, 0.0, -0.0, 65536.0, 2.0 ** 31, -2.0 ** 31, 2.0 ** 63]


def every_conversion(x):
    return [x.to(dtype) for dtype in INTEGER_DTYPES]


def computed_nan_and_infinities(b):
    """A bool's 0/0 is NaN and 1/0 inf where b is False and True; the kernel's own values, visible to the compiler."""
    quotient = b / b
    extreme = torch.maximum(-quotient, quotient)
    return [t.to(dtype) for t in (quotient, extreme, b / (~b)) for dtype in INTEGER_DTYPES]


def _assert_equal(got, expected):
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype and torch.equal(g, e), (k, g.tolist(), e.tolist())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_edge_values_convert_as_eager(dtype):
    x = torch.tensor(EDGES, dtype=torch.float64).to(dtype)
    kiln.reset()
    _assert_equal(kiln.compile(every_conversion, dynamic=False)(x), every_conversion(x))


def test_a_nan_the_kernel_computes_converts_as_eager():
    b = torch.tensor([True, False, True])
    kiln.reset()
    _assert_equal(kiln.compile(computed_nan_and_infinities, dynamic=False)(b), computed_nan_and_infinities(b))
