"""NaN bits beside eager's CPU kernels, viewed as integers (kiln/codegen/cpp/prelude.h, lower/ops/pointwise.py).

IEEE leaves the sign and payload of most NaN results open; eager's CPU kernels fix some of them in their own
code, and a program that views a result as integers (`.view(torch.int16)`) sees those bits:

- a bf16 op computes in float and rounds with ATen's vectorized conversion, which makes every NaN 0xffff;
- a fp16 op rounds with x86's conversion instruction, which keeps the NaN's sign and upper payload;
- a bf16 reduction's result is converted one element at a time (c10's scalar rule): a NaN is 0x7fc0;
- `torch.maximum` / `torch.minimum` OR a NaN mask into the result: a NaN comes out all ones; between equal
  values (0.0 and -0.0) they return the second operand (relu and clamp return the first);
- copies, `where`, negation keep a NaN's bits (negation flips its sign).

These hold in eager's vectorized loop, which every element of a tensor a multiple of the vector width long
sees (512 elements here); its scalar loop, for a shorter tail, makes other NaNs and kiln follows the loop
most elements see. NaNs whose bits come from the hardware or libm (0 * inf, sqrt(-1), a NaN meeting a NaN
in a fused formula) are not here: x86 returns one of the operands' NaN and the C++ compiler may swap a
commutative op's operands, so their bits are not a property kiln's source can fix.
"""
from __future__ import annotations

import pytest
import torch

import kiln

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
AS_INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
          torch.float64: torch.int64}


def _nans_and_numbers(dtype: torch.dtype, n: int = 512) -> torch.Tensor:
    """NaNs of both signs and of a non-default payload between numbers, inf and zeros: `n` elements."""
    bits = {torch.float16: [0x7E00, 0xFE00, 0x7E01], torch.bfloat16: [0x7FC0, 0xFFC0, 0x7FC1],
            torch.float32: [0x7FC00000, 0xFFC00000, 0x7FC00001],
            torch.float64: [0x7FF8000000000000, -0x8000000000000, 0x7FF8000000000001]}[dtype]
    nans = torch.tensor(bits, dtype=torch.int64).to(AS_INT[dtype]).view(dtype)  # wraps to the signed bits
    numbers = torch.tensor([0.0, -0.0, 1.5, -2.0, float("inf"), float("-inf")], dtype=dtype)
    pattern = torch.cat([nans, numbers, nans.flip(0), numbers.flip(0)])
    return pattern.repeat(n // len(pattern) + 1)[:n]


def _numbers(dtype: torch.dtype, n: int = 512) -> torch.Tensor:
    """Numbers only, inf and zeros among them (0 * inf and inf - inf make NaNs): `n` elements."""
    return torch.tensor([1.0, float("inf"), 0.0, float("-inf"), -3.0, 2.5, -0.0], dtype=dtype).repeat(74)[:n]


def _one_nan_a_row(dtype: torch.dtype) -> torch.Tensor:
    """64 rows of 8 finite numbers, the fourth of each a NaN (one per row: the row's reduction makes that NaN)."""
    x = torch.linspace(-4, 4, 512, dtype=dtype).reshape(64, 8)
    x[:, 3] = _nans_and_numbers(dtype)[:64]
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(AS_INT[t.dtype]) if t.dtype in AS_INT else t


OPS = {  # x holds NaNs, y numbers only: a NaN never meets a NaN (x86 returns either's, as the compiler orders)
    "x * 1": lambda x, y: x * 1,
    "x + y": lambda x, y: x + y,
    "0 * inf": lambda x, y: y * y.roll(1),
    "inf - inf": lambda x, y: y - y.roll(2),
    "relu": lambda x, y: torch.relu(x),
    "clamp": lambda x, y: x.clamp(-1, 1),
    "maximum": lambda x, y: (torch.maximum(x, y), torch.maximum(y, x)),
    "minimum": lambda x, y: (torch.minimum(x, y), torch.minimum(y, x)),
    "where": lambda x, y: torch.where(y > 0, x, y),
    "neg": lambda x, y: -x,
    "clone": lambda x, y: x.clone(),
    "to float32": lambda x, y: x.float(),
    "to bfloat16": lambda x, y: (x * 1).to(torch.bfloat16),
    "to float16": lambda x, y: (x * 1).half(),
    "sum of rows": lambda x, y: (_one_nan_a_row(x.dtype) * 1).sum(1),
}


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_nan_bits_as_eager_computes_them(op, dtype):
    def program(x, y):
        out = OPS[op](x, y)
        return [_bits(t) for t in (out if isinstance(out, tuple) else (out,))]

    x, y = _nans_and_numbers(dtype), _numbers(dtype)
    for k, (expected, got) in enumerate(zip(program(x, y), kiln.compile(program)(x, y))):
        same = expected == got
        assert bool(same.all()), f"{op} in {dtype}, result {k}: {int((~same).sum())} elements differ, e.g. " \
            f"{[hex(v) for v in got[~same][:3].tolist()]} vs eager's {[hex(v) for v in expected[~same][:3].tolist()]}"
