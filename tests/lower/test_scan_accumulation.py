"""Cumulative sums and products accumulate in the dtype eager's CPU kernel does: double for float32, float32 for
half types. A float32 accumulator lost what eager keeps: `1e8 + 1 - 1e8` is 1 in eager and was 0, and a running
product through `1e30 * 1e30 * 1e-30` came back to 1e30 in eager and stayed inf (the zero-safe products of
`prod`'s backward, autograd/test_eager_formulas.py, are such products)."""
from __future__ import annotations

import pytest
import torch

import kiln


def running_sum(x):
    return x.cumsum(0) * 1


def running_product(x):
    return x.cumprod(-1) * 1


def running_sum_in_bf16(x):
    return x.to(torch.bfloat16).cumsum(0)


CASES = {
    "cancelling_sum": (running_sum, [1e8, 1.0, -1e8, 3.0]),
    "product_through_overflow": (running_product, [1e30, 1e30, 1e-30, 2.0]),
    "product_through_underflow": (running_product, [1e-30, 1e-30, 1e30, 3.0]),
    "bf16_sum": (running_sum_in_bf16, [256.0, 1.0, -256.0, 3.0]),
}


@pytest.mark.parametrize("fn,values", CASES.values(), ids=CASES.keys())
def test_scan_is_eagers(fn, values):
    x = torch.tensor(values)
    torch.testing.assert_close(kiln.compile(fn)(x), fn(x), equal_nan=True, rtol=0, atol=0)
