"""The Hurwitz zeta function and polygamma of orders past 1 as kernels (kiln/lower/ops/pointwise.py `zeta`,
`polygamma`; the C++ prelude's kiln::zeta and the Triton helper kiln_zeta), beside eager.

ATen computes polygamma(n, x) for n >= 2 as (-1)^(n+1) n! zeta(n + 1, x), and zeta by Cephes' series: the cases
cover each of its branches (the poles and NaNs of its domain, a negative shift, whose direct sum runs longer than
nine terms, the Euler-Maclaurin tail, a term small enough to stop early) on both targets, and under dynamic
sizes.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.lowering import check, check_triton, count_externs
from support.triton_device import skip_unless_kernels_run

SHIFTS = torch.tensor([0.25, 0.5, 1.0, 1.5, 3.0, 8.75, 9.0, 12.5, 1e3, 1e9, 0.0, -1.0, -2.5, -7.25, -17.5, 1e-4,
                       float("inf"), float("nan")], dtype=torch.float64)
ORDERS = torch.tensor([2.0, 3.0, 1.0, 0.5, 1.5, 4.0, 7.0, 2.5, 30.0, 3.0, 2.0, 2.0, 2.0, 4.0, 3.0, 5.0, 2.0, 2.0],
                      dtype=torch.float64)


def _cases(dtype):
    return ORDERS.to(dtype), SHIFTS.to(dtype)


def _zeta_and_polygammas(x, q):
    return (torch.special.zeta(x, q), torch.polygamma(2, q), torch.polygamma(3, q), torch.polygamma(4, q * 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_zeta_and_polygamma_are_kernels_with_eagers_values(dtype):
    compiled = check(_zeta_and_polygammas, *_cases(dtype))
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_triton_zeta_and_polygamma(dtype):
    skip_unless_kernels_run()
    check_triton(_zeta_and_polygammas, *_cases(dtype))


def test_polygamma_under_dynamic_sizes(compiled_graphs):
    """The dynamic table's case: `polygamma(n, x)` with x of symbolic size and n an int argument, which the op's
    schema (`int n`) specializes: one graph per order serves every size, each a kernel; eager's values and
    gradients."""
    fn = lambda n, x: torch.polygamma(n, x).sin()  # noqa: E731
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for n in (2, 3):
        for size in (5, 7):
            x = SHIFTS[:size].clone().requires_grad_()
            expected, got = fn(n, x), compiled(n, x)
            torch.testing.assert_close(got, expected)
            torch.testing.assert_close(torch.autograd.grad(got.sum(), x)[0],
                                       torch.autograd.grad(expected.sum(), x)[0])
    assert len(compiled_graphs) == 4, [g.artefacts["name"] for g in compiled_graphs]  # forward, backward per order
    assert all(count_externs(g) == 0 for g in compiled_graphs), [str(g.artefacts["schedule"]) for g in compiled_graphs]
