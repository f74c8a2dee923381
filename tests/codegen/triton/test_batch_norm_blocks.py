"""A residual block's batch norms in training, on the Triton target: values against eager under the interpreter,
kernels compiled for sm_90.

The statistics of the block's two batch norms (the last convolution's and the downsample branch's) and, in the
backward, the sums over the gradient both branches share, are reductions over N*H*W per channel of the same
sizes: they fuse into one kernel. Each reduction reads only what the kernel's first loop reads, so they run in
that loop (kiln/schedule/fusion.py, `merge_independent_segments`) and a channels-last kernel splits its rows
across programs. A second loop after the first one's epilogue kept such a kernel from splitting: it ran one
program per 16 channels over every row of the activation.
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

aten = torch.ops.aten
EPS = 1e-5
# 140 rows per channel: not a multiple of a chunk, and few enough for the interpreter (it walks Welford's statistics
# element by element) while still split over NHWC; 40 channels fill no column tile
SHAPE = (4, 40, 5, 7)


def statistics(y, d, weight, bias, weight_d, bias_d):
    """Both batch norms of a downsampling block's output in training (batch statistics), the sum and ReLU after
    them, as an AMP step computes them: the norms in float32, the activation rounded back."""
    out, mean, invstd = aten.native_batch_norm(wide(y), weight, bias, None, None, True, 0.1, EPS)
    out_d, mean_d, invstd_d = aten.native_batch_norm(wide(d), weight_d, bias_d, None, None, True, 0.1, EPS)
    return torch.relu(out + out_d).to(y.dtype), mean, invstd, mean_d, invstd_d


def backward(grad, out, y, d, weight, mean, invstd, weight_d, mean_d, invstd_d):
    """The block's backward through the ReLU into both batch norms: one masked gradient, summed per channel by
    each branch (alone and times its normalized input)."""
    masked = torch.where(out > 0, wide(grad), 0.0)
    grads = aten.native_batch_norm_backward(masked, wide(y), weight, None, None, mean, invstd, True, EPS,
                                            [True, True, True])
    grads_d = aten.native_batch_norm_backward(masked, wide(d), weight_d, None, None, mean_d, invstd_d, True, EPS,
                                              [True, True, True])
    return grads[0].to(grad.dtype), grads[1], grads[2], grads_d[0].to(grad.dtype), grads_d[1], grads_d[2]


def compiled_and_checked(fn, *inputs) -> str:
    """`fn` compiled for the Triton target, its outputs against the same computation in float64: within four
    times eager's error plus a few rounding steps of the values reduced (eager's CPU batch norm adds its
    statistics more precisely than a Welford walk, as on the GPU eager's own kernel does; either is a float32
    sum, off by a few ulps of its terms). Every kernel compiled for sm_90; returns the kernels' source."""
    compiled, inputs, builds = compile_for_triton(fn, *inputs)
    with torch.no_grad():
        got, expected = compiled(*inputs), fn(*inputs)
        exact = fn(*[x.double() for x in inputs])
    scale = max(x.abs().max().item() for x in inputs)
    for k, (g, e, x) in enumerate(zip(*(tree_flatten(v)[0] for v in (got, expected, exact)))):
        assert g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride(), k
        steps = 4 * torch.finfo(e.dtype).eps * max(scale, x.abs().max().item())
        allowed = 4 * (e.double() - x).abs().max().item() + steps
        error = (g.double() - x).abs().max().item()
        assert error <= allowed, f"output {k}: error {error:.3g} > {allowed:.3g}"
    assert_compiles_for_sm90(builds)
    return compiled.artefacts["kernels.py"]


def activation(dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    x = (torch.randn(SHAPE) * 2 + 0.5).to(dtype)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def kernels(source: str) -> list[str]:
    return source.split("@triton.jit")[1:]


def assert_one_loop_per_kernel(source: str, channels_last: bool) -> None:
    """No kernel walks the rows twice; over NHWC the channels' sums split their rows across programs."""
    assert all(k.count("for roffset in") <= 1 for k in kernels(source)), source
    if channels_last:
        assert re.search(r"split reduction over outer \(40\)", source), source


@pytest.mark.parametrize("dtype, channels_last", [(torch.bfloat16, True), (torch.float32, False)],
                         ids=["bf16-nhwc", "fp32-nchw"])
def test_two_batch_norms_statistics_share_one_loop(dtype, channels_last):
    y, d = activation(dtype, channels_last), activation(dtype, channels_last)
    params = [torch.randn(40), torch.randn(40), torch.rand(40) + 0.5, torch.randn(40)]
    source = compiled_and_checked(statistics, y, d, *params)
    assert_one_loop_per_kernel(source, channels_last)


@pytest.mark.parametrize("dtype, channels_last", [(torch.float32, True), (torch.bfloat16, False)],
                         ids=["fp32-nhwc", "bf16-nchw"])
def test_two_batch_norms_backward_sums_share_one_loop(dtype, channels_last):
    y, d = activation(dtype, channels_last), activation(dtype, channels_last)
    weight, weight_d = torch.rand(40) + 0.5, torch.randn(40)
    _, mean, invstd = aten.native_batch_norm(y.float(), None, None, None, None, True, 0.1, EPS)
    _, mean_d, invstd_d = aten.native_batch_norm(d.float(), None, None, None, None, True, 0.1, EPS)
    out = activation(dtype, channels_last)
    source = compiled_and_checked(backward, activation(dtype, channels_last), out, y, d, weight, mean, invstd,
                                  weight_d, mean_d, invstd_d)
    assert_one_loop_per_kernel(source, channels_last)


def statistics_around_a_convolution(y, x, conv_weight, weight, bias, weight_d, bias_d):
    """As `statistics`, with the downsample branch's input computed by a convolution between the two norms, as
    a residual block runs them: the first norm's statistics kernel writes only graph outputs (the saved mean and
    invstd), so it moves past the convolution to where its values are read (kiln/schedule/order.py), next to
    the second norm's statistics."""
    out, mean, invstd = aten.native_batch_norm(wide(y), weight, bias, None, None, True, 0.1, EPS)
    d = aten.convolution(x, conv_weight, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    out_d, mean_d, invstd_d = aten.native_batch_norm(wide(d), weight_d, bias_d, None, None, True, 0.1, EPS)
    return torch.relu(out + out_d).to(y.dtype), mean, invstd, mean_d, invstd_d


@pytest.mark.parametrize("dtype, channels_last", [(torch.bfloat16, True), (torch.float32, False)],
                         ids=["bf16-nhwc", "fp32-nchw"])
def test_statistics_moved_past_a_convolution_share_one_loop(dtype, channels_last):
    y = activation(dtype, channels_last)
    x = torch.randn(SHAPE[0], 8, *SHAPE[2:]).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    conv_weight = (torch.randn(SHAPE[1], 8, 1, 1) * 0.3).to(dtype)
    params = [torch.randn(40), torch.randn(40), torch.rand(40) + 0.5, torch.randn(40)]
    source = compiled_and_checked(statistics_around_a_convolution, y, x, conv_weight, *params)
    assert_one_loop_per_kernel(source, channels_last)
