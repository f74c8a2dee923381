"""Powers by a number, beside eager, bit for bit (kiln/lower/ops/pointwise.py, POWERS).

ATen's CPU pow special-cases some exponents: `x ** 3` is `x * x * x`, `x ** -2` is `1 / (x * x)`, `x ** 0.5` a
square root and `x ** -0.5` one over it. For bf16 it runs them over Vectorized<BFloat16>, whose every op rounds
to bf16 (`x ** 3` rounds `x * x` before the last multiply); fp16 computes them in float and rounds once, and
takes pow for +-0.5 (`(-0.0) ** 0.5` is 0.0 there, -0.0 in bf16 and float32). A tensor exponent takes pow.
Every case runs on the C++ target and on the Triton target (over CPU tensors, under TRITON_INTERPRET=1).

Not here: float32 `x ** 0.5` and pow by another number or a tensor compute with MKL's sqrt and Sleef's pow,
which round some results an ulp away from the C library's (as their `torch.sqrt` and `torch.exp` do).
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.triton_device import DEVICE, INTERPRETING

TARGETS = [None, pytest.param({"cpu_backend": "triton"}, marks=pytest.mark.skipif(
    DEVICE != "cpu" or not INTERPRETING, reason="Triton kernels over CPU tensors need TRITON_INTERPRET=1"))]

POWERS = {  # each exponent a literal: kiln reads it as a constant, as eager's kernel does
    "2": lambda x: (x ** 2, torch.pow(x, 2)),
    "3": lambda x: (x ** 3, torch.pow(x, 3), x.pow(3.0)),
    "-1": lambda x: (x ** -1,),
    "-2": lambda x: (x ** -2, torch.pow(x, -2)),
    "0.5": lambda x: (x ** 0.5, torch.pow(x, 0.5)),
    "-0.5": lambda x: (x ** -0.5,),
}
TENSOR_EXPONENTS = {
    "0-d float32": lambda x: (x ** torch.tensor(3.0), torch.pow(x, torch.tensor(-2.0))),
    "0-d same dtype": lambda x: (x ** torch.tensor(3.0, dtype=x.dtype), x ** torch.tensor(0.5, dtype=x.dtype)),
    "full": lambda x: (x ** torch.full_like(x, 3.0), x.abs() ** torch.full_like(x, -0.5)),
}


def _bases(dtype: torch.dtype) -> torch.Tensor:
    """Zeros of both signs, infinities, then random values: 512 in all, so that eager computes every element in
    its vectorized loop (its scalar loop, for a tail shorter than a vector, rounds some steps of its own)."""
    edges = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1.0, -1.0])
    random = torch.randn(512 - len(edges), generator=torch.Generator().manual_seed(0)) * 3
    return torch.cat([edges, random]).to(dtype)


def _assert_bitwise(got, expected, what: str) -> None:
    for k, (g, e) in enumerate(zip(got, expected)):
        same = ((g == e) & (g.signbit() == e.signbit())) | (g.isnan() & e.isnan())
        assert bool(same.all()), f"{what}, result {k}: {int((~same).sum())} elements differ, e.g. bases " \
            f"{_bases(e.dtype)[~same][:3].tolist()}: {g[~same][:3].tolist()} vs eager's {e[~same][:3].tolist()}"


@pytest.mark.sampled(every=2, classes=("power", "dtype"))
@pytest.mark.parametrize("options", TARGETS, ids=["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("power", list(POWERS))
def test_a_power_by_a_number_as_in_eager(power, dtype, options):
    program = POWERS[power]
    if dtype in (torch.float32, torch.float64) and power == "0.5":
        pytest.skip("eager's float sqrt is MKL's (see the module docstring)")
    x = _bases(dtype)
    kiln.reset()
    _assert_bitwise(kiln.compile(program, options=options)(x), program(x), f"x ** {power} in {dtype}")


@pytest.mark.sampled(every=2, classes=("exponent", "dtype"))
@pytest.mark.parametrize("options", TARGETS, ids=["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("exponent", list(TENSOR_EXPONENTS))
def test_a_half_type_power_by_a_tensor_as_in_eager(exponent, dtype, options):
    program = TENSOR_EXPONENTS[exponent]
    x = _bases(dtype)
    kiln.reset()
    _assert_bitwise(kiln.compile(program, options=options)(x), program(x), f"{exponent} exponent in {dtype}")
