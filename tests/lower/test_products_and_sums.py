"""addbmm and bilinear's _trilinear decomposed into a product and a fused sum (kiln/lower/decompositions.py),
forward and backward beside eager; half types keep ATen's call, whose matmuls accumulate in float32."""
from __future__ import annotations

import pytest
import torch

import kiln
from support.lowering import check, count_externs

G = torch.Generator().manual_seed(0)

CASES = {
    "addbmm": (lambda s, b1, b2: torch.addbmm(s, b1, b2, beta=0.5, alpha=2),
               (torch.randn(3, 5, generator=G), torch.randn(4, 3, 6, generator=G), torch.randn(4, 6, 5, generator=G))),
    "addbmm_beta0_broadcast": (lambda s, b1, b2: torch.addbmm(s, b1, b2, beta=0),
                               (torch.full((5,), float("nan")), torch.randn(2, 3, 4, generator=G),
                                torch.randn(2, 4, 5, generator=G))),
    "bilinear": (lambda x1, w, x2: torch.nn.functional.bilinear(x1, x2, w),
                 (torch.randn(4, 3, generator=G), torch.randn(2, 3, 5, generator=G), torch.randn(4, 5, generator=G))),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", CASES)
def test_forward_and_backward_match_eager(name, dtype):
    fn, inputs = CASES[name]
    inputs = [t.to(dtype) for t in inputs]
    compiled = check(fn, *inputs)
    assert count_externs(compiled) == (1 if name.startswith("addbmm") else 0)  # the bmm, by design
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    expected = torch.autograd.grad(out, leaves, cotangent)
    kiln.reset()
    got = torch.autograd.grad(kiln.compile(fn, dynamic=False)(*leaves), leaves, cotangent)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("name", CASES)
def test_half_types_keep_the_aten_call(name):
    fn, inputs = CASES[name]
    compiled = check(fn, *[t.to(torch.bfloat16) for t in inputs])
    assert count_externs(compiled) == 1, compiled.artefacts["schedule"]
