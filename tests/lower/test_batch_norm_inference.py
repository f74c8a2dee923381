"""Batch norm with running statistics (a module in eval mode), beside eager, bit for bit (kiln/lower/decompositions.py,
`_batch_norm_inference_as_eager`).

Eager's CPU kernel folds the statistics into one scale and shift per channel, alpha = weight / sqrt(var + eps) and
beta = bias - mean * alpha, and computes `x * alpha + beta` (both fused multiply-adds where GCC contracts them);
torch's decomposition computes `(x - mean) * invstd * weight + bias`, an ulp off in a third of the elements, which a
bf16 autocast region after it turns into bf16 ulps (fuzz seed 101920). Every layout eager's kernel has a path for
(2-d, 3-d, 4-d contiguous and channels-last), with and without the affine parameters, half-type inputs with float
parameters, and under autograd (the eval-mode graph of a module whose parameters require grad). float64 is not
here: its fused multiply-add has no wider type to be computed in, and kiln's rounds twice.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.triton_device import DEVICE, INTERPRETING

TARGETS = [None, pytest.param({"cpu_backend": "triton"}, marks=pytest.mark.skipif(
    DEVICE != "cpu" or not INTERPRETING, reason="Triton kernels over CPU tensors need TRITON_INTERPRET=1"))]

SHAPES = {"(N, C)": ((300, 5), torch.nn.BatchNorm1d), "(N, C, L)": ((6, 5, 40), torch.nn.BatchNorm1d),
          "(N, C, H, W)": ((4, 5, 6, 7), torch.nn.BatchNorm2d), "channels-last": ((4, 5, 6, 7), torch.nn.BatchNorm2d)}


def _module(kind, affine: bool) -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    bn = kind(5, affine=affine).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(5, generator=g))
        bn.running_var.copy_(torch.rand(5, generator=g) + 0.5)
        if affine:
            bn.weight.copy_(torch.randn(5, generator=g))
            bn.bias.copy_(torch.randn(5, generator=g))
    return bn


def _input(shape: str, dtype: torch.dtype) -> torch.Tensor:
    size, _ = SHAPES[shape]
    x = (torch.randn(size, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if shape == "channels-last" else x


@pytest.mark.sampled(every=2, classes=("shape", "dtype"))
@pytest.mark.parametrize("options", TARGETS, ids=["cpp", "triton"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_batch_norm_in_eval_mode_as_eager(shape, affine, dtype, options):
    bn = _module(SHAPES[shape][1], affine)
    x = _input(shape, dtype)
    kiln.reset()
    with torch.no_grad():
        got, expected = kiln.compile(bn, options=options)(x), bn(x)
    assert torch.equal(got, expected), f"{int((got != expected).sum())} of {got.numel()} elements differ"


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic"])
@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_batch_norm_in_eval_mode_with_parameters_requiring_grad(backend, dynamic):
    """The training graph of an eval-mode module: its forward rounds as eager's; its gradients are eager's up to
    the order of the weight gradient's sum. With symbolic sizes the module's batch norm reaches the code
    generator's table as `_native_batch_norm_legit_no_training`, whose decomposition once looped through the
    autograd stage's table until Python's stack ran out (fuzz seed 104347's eval-mode call)."""
    bn = _module(torch.nn.BatchNorm2d, affine=True)
    x = _input("(N, C, H, W)", torch.float32).requires_grad_()
    kiln.reset()
    results = []
    for f in (bn, kiln.compile(bn, backend=backend, dynamic=dynamic)):
        x.grad = bn.weight.grad = None
        out = f(x)
        out.backward(torch.ones_like(out))
        results.append((out.detach(), x.grad, bn.weight.grad))
    assert torch.equal(results[1][0], results[0][0])
    for got, expected in zip(results[1][1:], results[0][1:]):
        torch.testing.assert_close(got, expected)
