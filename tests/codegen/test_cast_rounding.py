"""A down-cast rounds where eager rounds, forward and backward, on the C++ and the Triton target.

Eager rounds a value to bf16/fp16 (or float64 to float32) at every op whose result has that dtype: a cast, an
op computed in float and stored in the half type, a reduction's result, and in a backward each gradient that
crosses a cast (`x.bfloat16()`'s backward rounds the incoming float32 gradient to bf16 first). kiln computes
fused half-type values in float; each must still be rounded at those points, including a value kept in
registers for the ops fused after it (a bf16 sum read by `.float()` in the same kernel).

The inputs are small multiples of 1/64: every float32 sum and product of them is exact, so the only inexact
steps are the roundings to the narrower dtype, and kiln must equal eager bit for bit.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.triton_device import DEVICE, INTERPRETING

TARGETS = ["cpp", pytest.param("triton", marks=pytest.mark.skipif(
    DEVICE != "cpu" or not INTERPRETING, reason="Triton kernels over CPU tensors need TRITON_INTERPRET=1"))]


def sixty_fourths(*shape, seed: int, dtype=torch.float32, grad: bool = False, bound: int = 700) -> torch.Tensor:
    """Values k/64 with |k| < bound: ten significant bits, more than bf16 holds, exact in float32."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(-bound, bound, shape, generator=g) / 64).to(dtype).requires_grad_(grad)


def chained_down_casts(x):
    """Casts down and back up, each step a rounding eager makes (or exactly none, for float32 -> float64 -> float32)."""
    return (x.bfloat16().float() - x, x.half().bfloat16().float(), x.bfloat16().half().float(),
            (x.double() / 3).float().double() * 3, x.double().float() - x,
            (x.bfloat16() * 3).float() + x)


def half_reductions_read_in_float(x):
    """A half-type reduction's result, rounded once, read in float by ops fused after it in the same kernel."""
    h = x.bfloat16()
    return (h.sum(0).float() * 2 + 1, h.sum().float() - 0.5, x.half().sum(1, keepdim=True).float() * x,
            (h * h).sum(1).double(), h.mean(0).float() + 1)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [chained_down_casts, half_reductions_read_in_float], ids=lambda f: f.__name__)
def test_forward_rounds_where_eager_rounds(fn, target):
    x = sixty_fourths(4, 6, seed=0)
    compiled = kiln.compile(fn, options={"cpu_backend": target})
    with torch.no_grad():
        for k, (got, expected) in enumerate(zip(compiled(x), fn(x))):
            assert got.dtype == expected.dtype and torch.equal(got, expected), (k, got, expected)


@pytest.mark.parametrize("target", TARGETS)
def test_long_rows_round_their_result(target):
    """Rows long enough for the C++ target's threaded reduction and the Triton target's looped and split ones:
    each merges float partials, then rounds the result once."""
    def fn(x):
        h = x.bfloat16()
        return h.sum(1).float() * 2 + 1, h.sum().float() - 0.5, h.mean(1).float() + 1

    x = sixty_fourths(2, 20000, seed=4, bound=100)  # sums of up to 2**21 sixty-fourths: exact in float32
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # eager's threaded bf16 sum rounds each thread's partial; on one thread it rounds once
    try:
        with torch.no_grad():
            expected = fn(x)
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        for k, (got, want) in enumerate(zip(kiln.compile(fn, options={"cpu_backend": target})(x), expected)):
            assert torch.equal(got, want), (k, got, want)


def scaled_tanh(b, c):
    """Fuzz seed 4147: `c * tanh(b)` is bf16, so c's gradient is a bf16 sum of bf16 products, then float32."""
    return (c * torch.tanh(b)).float()


def cast_round_trip(b, c):
    """The gradient crossing `.float()` back to a bf16 tensor is rounded to bf16, then widened to c's float32."""
    return (b.float() * c).bfloat16().float() * c


def float64_detour(b, c):
    """float32 -> float64 and back: the backward rounds the float64 gradient to float32 at the cast."""
    return (c.double() / 3 * b.double()).float()


def half_sum_then_float(b, c):
    return b.sum(0).float() * c + (b * c).sum(1, keepdim=True).float()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [scaled_tanh, cast_round_trip, float64_detour, half_sum_then_float],
                         ids=lambda f: f.__name__)
def test_backward_rounds_where_eager_rounds(fn, target):
    def inputs():
        return sixty_fourths(3, 5, seed=1, dtype=torch.bfloat16, grad=True), sixty_fourths(seed=2, grad=True)

    weights = sixty_fourths(3, 5, seed=3)
    grads = []
    for run in (fn, kiln.compile(fn, options={"cpu_backend": target})):
        b, c = inputs()
        out = run(b, c)
        (out * weights[..., :out.shape[-1]]).sum().backward()
        grads.append((out.detach(), b.grad, c.grad))
    for k, (got, expected) in enumerate(zip(*grads[::-1])):
        assert got.dtype == expected.dtype and torch.equal(got, expected), (k, got, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_half_product_rounds_after_every_factor_on_the_cpu(dtype):
    """Eager's CPU product of a half type keeps its running product in that type (its sum keeps float): rows
    and columns, in order. (CUDA's accumulates in float, as the Triton target does.)"""
    g = torch.Generator().manual_seed(5)
    x = (1 + torch.randn(6, 9, generator=g) * 0.3).to(dtype)

    def fn(x):
        return x.prod(1), x.prod(0), x.prod(1).float() * 2

    with torch.no_grad():
        for k, (got, expected) in enumerate(zip(kiln.compile(fn)(x), fn(x))):
            assert torch.equal(got, expected), (k, got, expected)


@pytest.mark.parametrize("target", TARGETS)
def test_wide_values_round_to_half_types_through_float(target):
    """Eager converts a float64 or int64 value to bf16/fp16 through float (c10's half types are made from a
    float): rounded twice, which differs from rounding once where the float value is a tie."""
    wide = torch.tensor([1 + 2**-8 + 2**-30, 1 + 2**-11 + 2**-30, -(1 + 2**-8 + 2**-30)], dtype=torch.float64)
    ints = torch.tensor([2**40 + 2**32 + 1, 2**30 + 2**19 + 1, 2**24 + 1, 7])

    def fn(wide, ints):
        return (wide.bfloat16(), wide.half(), (wide * 3).bfloat16().float(), ints.bfloat16(),
                (ints + 1).half(), (ints * 2).bfloat16())

    with torch.no_grad():
        got = kiln.compile(fn, options={"cpu_backend": target})(wide, ints)
        for k, (g, e) in enumerate(zip(got, fn(wide, ints))):
            assert g.dtype == e.dtype and torch.equal(g, e), (k, g, e)


@pytest.mark.parametrize("target", TARGETS)
def test_integers_convert_to_float_before_they_are_summed(target):
    """A float32 sum or mean of an int64 tensor converts each element, then sums (as eager does): 2**24 + 1
    becomes 2**24 three times, where the integer sum converted once would round up."""
    a = torch.full((3,), 2**24 + 1)

    def fn(a):
        return (a.mean(dtype=torch.float32), a.sum(dtype=torch.float32), a.float().mean(), a.float().sum() / 3,
                a.sum(0, dtype=torch.float64), (a * 2).bfloat16().sum())

    with torch.no_grad():
        got = kiln.compile(fn, options={"cpu_backend": target})(a)
        for k, (g, e) in enumerate(zip(got, fn(a))):
            assert g.dtype == e.dtype and torch.equal(g, e), (k, g, e)
