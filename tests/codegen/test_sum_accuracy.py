"""A float sum through kiln's C++ kernels is as close to the exact sum as eager's, and a full reduction in blocks counts
every element once.

Eager's CPU sum is a cascade: its error stays near one rounding however many elements it adds. A loop that adds
each element to one float accumulator (per thread or SIMD lane) loses bits at every step once the partial is large,
and its error grows with the count: a bias gradient summing 968 elements came out 30x further from the exact sum
than eager's (the OpInfo row `nn.functional.conv_transpose2d|float32|cpp|bwd`). kiln's float sums accumulate in
double. Every shape of reduction kernel is covered: a full reduction (threads' partials merged), rows, columns
(tiles of per-column accumulators) and a two-pass variance."""
import pytest
import torch

import kiln


def full_sum(x):
    return x.sum()


def row_sums(x):
    return x.sum(-1)


def column_sums(x):
    return x.sum(0)


def bias_gradient(x):  # sum over batch and spatial dims of an NCHW tensor
    return x.view(8, 4, 50, 50).sum((0, 2, 3))


def row_variance(x):
    return x.var(-1)


def row_softmax_denominator(x):
    return x.exp().sum(-1)


@pytest.mark.parametrize("fn", [full_sum, row_sums, column_sums, bias_gradient, row_variance,
                                row_softmax_denominator])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_float_sum_is_as_close_to_the_exact_sum_as_eagers(fn, dtype):
    x = (torch.randn(80, 1000, generator=torch.Generator().manual_seed(0)) + 3).to(dtype)  # a mean keeps partials large
    exact = fn(x.double())
    want, got = fn(x), kiln.compile(fn)(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    eager_error = (want.double() - exact).abs().max().item()
    kiln_error = (got.double() - exact).abs().max().item()
    one_rounding = exact.abs().max().item() * torch.finfo(dtype).eps
    assert kiln_error <= max(2 * eager_error, one_rounding), (kiln_error, eager_error)


@pytest.mark.parametrize("size", [4096, 4097, 3 * 4096 + 5])
@pytest.mark.parametrize("fn", [lambda x: x.sum(), lambda x: x.amax(), lambda x: x.argmin(), lambda x: x.var(),
                                lambda x: (x * x).mean()], ids=["sum", "amax", "argmin", "var", "mean_of_squares"])
def test_a_full_reduction_over_blocks_reads_every_element_once(fn, size):
    """A full reduction's innermost loop runs in blocks of 4096 elements shared among threads (codegen/cpp
    `_open_blocked_loops`): sizes around and across a block's edge, one loop and two (the rows of a matrix), and
    sizes the kernel reads as symbols, each element counted once."""
    x = torch.randn(size, generator=torch.Generator().manual_seed(size))
    for arg in (x, x[: size - size % 7].view(7, -1)):
        torch.testing.assert_close(kiln.compile(fn)(arg), fn(arg), rtol=1e-5, atol=1e-5)
    dynamic = kiln.compile(fn, dynamic=True)
    for n in (size, size + 1):
        y = torch.randn(n, generator=torch.Generator().manual_seed(n))
        torch.testing.assert_close(dynamic(y), fn(y), rtol=1e-5, atol=1e-5)
