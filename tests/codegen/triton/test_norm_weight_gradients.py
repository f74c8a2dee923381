"""A norm's weight gradient is a column sum that also reads the norm's per-row statistics: on the Triton target,
values against float64 under the interpreter, kernels compiled for sm_90, and the columns read in coalesced tiles.

A Llama-style RMSNorm's backward gets the norm's input h (the residual stream) and its per-row mean square saved
by the forward, and recomputes rstd = rsqrt(variance + eps) where it needs it. Two reductions read h and the
gradient:
- grad_h, a row reduction per token (the dot product of the gradient and h over the width);
- the weight's gradient, a column sum over every token of grad * h * rstd: a reduction over a strided dim, which
  also reads rstd, one value per token (per reduced row) with stride 1 along the reduced dim.
Only the loads that vary with the columns decide the kernel's shape: the per-token statistic made the weight
gradient a row reduction, one program per column whose every load walked memory with the width's stride (0.34 ms
for 8192 tokens x 768 on an H100, where the traffic allows tens of microseconds). The same class: a column sum
weighted per row (a loss weighted per sample), and a layer norm over the channels of an NHWC activation
(ConvNeXt's), whose mean and rstd are per position.
"""
from __future__ import annotations

import re

import pytest
import torch
from torch.utils._pytree import tree_flatten

from support.triton_device import skip_module_unless_kernels_run

skip_module_unless_kernels_run()

from codegen.triton.test_reduction_tiles import wide  # noqa: E402
from support.lowering import compile_for_triton  # noqa: E402
from support.triton_sm90 import assert_compiles_for_sm90  # noqa: E402

EPS = 1e-6
SHAPE = (2, 167, 96)  # 334 tokens (a multiple of no chunk) of a width that fills one and a half column tiles


def rms_norm_backward(grad_q, grad_k, grad_v, grad_stream, h, weight, variance):
    """The backward of transformers' LlamaRMSNorm of the residual stream h (weight * (h * rsqrt(mean(h^2) +
    eps))) whose output feeds three matmuls (their input gradients summed) and whose input is a residual stream
    (its gradient from the layer above added): grad_h, grad_h rounded for the matmul before it, and the weight's
    gradient, as the training step's partition computes them."""
    grad = wide(grad_q) + wide(grad_k) + wide(grad_v)
    rstd = torch.rsqrt(variance + EPS)
    grad_weight = (grad * (h * rstd)).sum((0, 1))
    grad_normed = grad * weight
    dot = (grad_normed * h).sum(-1, keepdim=True)
    grad_h = grad_stream + grad_normed * rstd + (dot * -0.5 * rstd ** 3 / h.shape[-1]) * (2 * h)
    return grad_h, grad_h.to(grad_q.dtype), grad_weight


def weighted_column_sums(x, per_row):
    """A sum over rows weighted per row (a loss weighted per sample), and the plain column sum beside it."""
    return (wide(x) * per_row[:, None]).sum(0), wide(x).sum(0)


def channels_layer_norm_weight_gradient(grad, x, mean, rstd):
    """The weight and bias gradients of a layer norm over dim 1 (the channels) of a channels-last activation: sums
    over every position of grad * (x - mean) * rstd and of grad, the statistics one value per position."""
    return (wide(grad) * ((wide(x) - mean) * rstd)).sum((0, 2, 3)), wide(grad).sum((0, 2, 3))


def compiled_and_checked(fn, *inputs) -> str:
    """`fn` compiled for the Triton target, each output within four times eager's error from the same computation
    in float64 plus a few rounding steps of its largest value (sums over hundreds of rows added in another
    order); every kernel compiled for sm_90. Returns the kernels' source."""
    compiled, inputs, builds = compile_for_triton(fn, *inputs)
    with torch.no_grad():
        got, expected = compiled(*inputs), fn(*inputs)
        exact = fn(*[x.double() for x in inputs])
    for k, (g, e, x) in enumerate(zip(*(tree_flatten(v)[0] for v in (got, expected, exact)))):
        assert g.dtype == e.dtype and g.shape == e.shape, (k, g.dtype, e.dtype, g.shape, e.shape)
        steps = 4 * torch.finfo(e.dtype).eps * x.abs().max().item()
        allowed = 4 * (e.double() - x).abs().max().item() + steps
        error = (g.double() - x).abs().max().item()
        assert error <= allowed, f"output {k}: error {error:.3g} > {allowed:.3g}"
    assert_compiles_for_sm90(builds)
    return compiled.artefacts["kernels.py"]


def column_partials(source: str, columns: int) -> list[str]:
    """The launchers of the split column reductions over `columns` (their partial pass)."""
    kernels = source.split("@triton.jit")
    names = [re.search(r"def (\w+)\(", k).group(1) for k in kernels[1:]
             if re.search(rf"split reduction over outer \({columns}\)", k) and "(partials)" in k]
    return [line for line in source.splitlines() if any(f"Launcher({name}," in line for name in names)]


@pytest.mark.parametrize("grad_dtype, stream_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.float32),
                                                      (torch.bfloat16, torch.bfloat16)],
                         ids=["bf16-grads-fp32-stream", "fp32", "bf16"])
def test_rms_norm_weight_gradient_reads_coalesced_column_tiles_split_over_tokens(grad_dtype, stream_dtype):
    grads = [torch.randn(SHAPE).to(grad_dtype) for _ in range(3)]
    h = (torch.randn(SHAPE) * 2 + 0.5).to(stream_dtype)
    variance = wide(h).pow(2).mean(-1, keepdim=True)
    source = compiled_and_checked(rms_norm_backward, *grads, torch.randn(SHAPE), wide(h), torch.rand(96) + 0.5,
                                  variance)
    (partial,) = column_partials(source, 96)
    xblock, rsplit, rchunk = (int(re.search(rf"{k}=(\d+)", partial).group(1)) for k in ("XBLOCK", "RSPLIT", "RCHUNK"))
    assert xblock == 64 and (rsplit - 1) * rchunk < 334 <= rsplit * rchunk, partial


def test_a_column_sum_weighted_per_row_splits_as_the_plain_one():
    x, per_row = torch.randn(900, 200), torch.rand(900)
    source = compiled_and_checked(weighted_column_sums, x, per_row)
    (partial,) = column_partials(source, 200)
    assert "XBLOCK=64" in partial, source


# CI runs the first dtype (KILN_MATRIX_SWEEP=1: both): the kernels' shape is the same in either, and the
# interpreter's seconds go to the reduction, not the casts (bf16 casts run in the other Triton tests)
@pytest.mark.sampled(every=2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_layer_norm_over_channels_sums_its_weight_gradient_in_column_tiles(dtype):
    shape = (3, 40, 11, 13)  # 429 positions of 40 channels
    grad, x = (torch.randn(shape).to(dtype).contiguous(memory_format=torch.channels_last) for _ in range(2))
    mean = wide(x).mean(1, keepdim=True)
    rstd = torch.rsqrt(wide(x).var(1, keepdim=True, correction=0) + 1e-6)
    source = compiled_and_checked(channels_layer_norm_weight_gradient, grad, x, mean, rstd)
    (partial,) = column_partials(source, 40)
    assert "XBLOCK=64" in partial, source
