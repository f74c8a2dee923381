"""A constant holds the value eager's tensor holds, bit for bit: filled in its dtype, and converted to another.

Lowering folds `full(v, dtype=src).to(dst)` into one constant. Its value is v as a `src` tensor holds it,
then converted: 0.1 in float32 is 0.100000001490116 once widened to float64, 0.1 in bf16 is 0.10009765625,
int64 2**40 + 1 wraps to 1 in int32 and rounds in float32. Checked on the C++ target; the Triton target's
are in tests/codegen/triton/test_literal_constants.py.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.lowering import compile_fn

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]
VALUES = {torch.int64: [2**40 + 1, -7], torch.int32: [2**30 + 1, -7], torch.int16: [-300], torch.int8: [-7],
          torch.uint8: [200], torch.bool: [True]}


@pytest.mark.parametrize("src", DTYPES, ids=str)
def test_a_constant_cast_to_every_dtype_is_eagers_value(src):
    values = VALUES.get(src, [0.1, 2.7])

    def fn(x):
        return [torch.full((2, 3), v, dtype=src).to(dst) for v in values for dst in DTYPES] + [x + 1]

    x = torch.randn(2, 3)
    got, expected = compile_fn(fn, x)(x), fn(x)
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype and torch.equal(g, e), (k, g, e)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_a_fill_holds_its_dtypes_value_in_arithmetic(dtype):
    """0.1 filled into a bf16 tensor is 0.10009765625 in every op that reads it, not 0.1 rounded afterwards:
    minus itself it is exactly 0, and equal to itself."""
    x = torch.full((2, 5), 0.1, dtype=dtype)

    def fn(x):
        return torch.full_like(x, 0.1) - x, torch.full((2, 5), 0.1, dtype=dtype) == x

    got, expected = compile_fn(fn, x)(x), fn(x)
    for g, e in zip(got, expected):
        assert torch.equal(g, e), (g, e)


def test_negative_and_positive_zero_constants_are_not_one_expression():
    """IR constants are dict keys all through code generation: `Const(-0.0) == Const(0.0)` under Python's ==, and
    `full_like(x, -0.0)` compiled after `full_like(x, 0.0)` got the earlier graph's +0.0 (the zeros' signs, seen
    through a bit view)."""
    x = torch.tensor([1.0, -1.0])
    positive = kiln.compile(lambda x: (torch.full_like(x, 0.0) * 1).view(torch.int32))(x)
    negative = kiln.compile(lambda x: (torch.full_like(x, -0.0) * 1).view(torch.int32))(x)
    assert positive.tolist() == [0, 0]
    assert negative.tolist() == [-2**31, -2**31]
