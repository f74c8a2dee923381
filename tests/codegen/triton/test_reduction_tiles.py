"""A training step's reduction kernels, run against eager under Triton's interpreter and compiled for sm_90.

The graphs are the ones a transformer's backward is made of (tests/codegen/triton/test_heuristics.py checks the
configurations they get):
- layer norm's backward with its weight and bias gradients: a row reduction per token (grad_input, one warp per
  program) and column sums over the tokens (the weight and bias gradients, 64-column tiles split over rows);
- GELU's backward stored for the next matmul and summed over the tokens in the same kernel (the bias gradient);
- batch norm's sums over NHWC activations (column sums over N*H*W).
Sizes are small for the interpreter but large enough for each kind of kernel: columns that do not fill a tile,
and row counts that are not multiples of a chunk. One-warp row programs are taken from 256 rows on here
(WARP_ROW_MIN_XNUMEL lowered), where a GPU takes them from 1024.
CI runs each shape in one dtype, float32 and bfloat16 taking turns; `KILN_TRITON_SWEEP=1` (or KILN_FULL_TESTS=1)
runs each shape in both.
"""
from __future__ import annotations

import itertools
import re

import pytest
import torch
from torch.utils._pytree import tree_flatten

from support.triton_device import DEVICE, skip_module_unless_kernels_run

skip_module_unless_kernels_run()

from kiln.codegen.triton import heuristics  # noqa: E402
from support.lowering import compile_for_triton  # noqa: E402
from support.sweeps import full  # noqa: E402
from support.triton_sm90 import assert_compiles_for_sm90  # noqa: E402

aten = torch.ops.aten
ROWS = 333  # not a multiple of any chunk


def compiled_and_checked(fn, *inputs):
    """`fn` compiled for the Triton target: its outputs against eager's, each within a tolerance from the same
    computation in float64 (a sum over a thousand rows, added in another order, differs from eager's in its
    last bits); every kernel compiled for sm_90. Returns the kernels' source."""
    compiled, inputs, builds = compile_for_triton(fn, *inputs)
    with torch.no_grad():
        got, expected = compiled(*inputs), fn(*inputs)
        exact = fn(*[x.double() if x.is_floating_point() else x for x in inputs])
    for k, (g, e, x) in enumerate(zip(*(tree_flatten(v)[0] for v in (got, expected, exact)))):
        assert g.dtype == e.dtype and g.shape == e.shape, (k, g.dtype, e.dtype, g.shape, e.shape)
        if not e.is_floating_point():  # indices: exactly eager's
            assert torch.equal(g, e), (k, g, e)
            continue
        # kiln's error from the float64 result within a few times eager's, plus an ulp of the output's dtype
        ulp = torch.finfo(e.dtype).eps * x.abs().max().item()
        allowed = 4 * (e.double() - x).abs().max().item() + 2 * ulp
        error = (g.double() - x).abs().max().item()
        assert error <= allowed, f"output {k}: error {error:.3g} > {allowed:.3g}"
    assert_compiles_for_sm90(builds)
    return compiled.artefacts["kernels.py"]


def wide(t: torch.Tensor) -> torch.Tensor:
    """`t` in the type the graphs compute in: float32, or float64 for the reference run."""
    return t if t.dtype == torch.float64 else t.float()


def launchers(source: str) -> list[str]:
    return [line for line in source.splitlines() if " = Launcher(" in line]


def layer_norm_backward(grad, x, weight, bias, mean, rstd):
    """native_layer_norm's backward as an AMP training step has it: a bf16 gradient from the matmul after the
    norm, the norm itself in float32, grad_input rounded back to bf16 for the matmul before it."""
    grad_input, grad_weight, grad_bias = aten.native_layer_norm_backward(
        wide(grad), x, [x.shape[-1]], mean, rstd, weight, bias, [True, True, True])
    return grad_input.to(grad.dtype), grad_weight, grad_bias


def layer_norm_inputs(rows: int, width: int, grad_dtype: torch.dtype):
    x = torch.randn(rows, width) * 2 + 0.5
    weight, bias = torch.randn(width), torch.randn(width)
    _, mean, rstd = aten.native_layer_norm(x, [width], weight, bias, 1e-5)
    return torch.randn(rows, width).to(grad_dtype), x, weight, bias, mean, rstd


DTYPES = (torch.float32, torch.bfloat16)


def shapes_and_dtypes(shapes: dict) -> list:
    """Each shape with each dtype under KILN_TRITON_SWEEP=1; in CI each shape once, the dtypes taking turns."""
    return [pytest.param(*shape, dtype, id=f"{dtype}-{name}") for i, (name, shape) in enumerate(shapes.items())
            for j, dtype in enumerate(DTYPES) if full("KILN_TRITON_SWEEP") or (i + j) % len(DTYPES) == 1]


@pytest.mark.parametrize("rows, width, dtype", shapes_and_dtypes({"warp-rows": (ROWS, 250), "narrow": (ROWS, 48),
                                                                   "few-rows": (40, 96)}))
def test_layer_norm_backward_with_weight_and_bias_gradients(rows, width, dtype, monkeypatch):
    monkeypatch.setattr(heuristics, "WARP_ROW_MIN_XNUMEL", 256)
    source = compiled_and_checked(layer_norm_backward, *layer_norm_inputs(rows, width, dtype))
    if rows >= 256 and width > 128:  # grad_input: one warp per program, 4 rows of 256
        assert any(re.search(r"num_warps=1, .*XBLOCK=4, RBLOCK=256\)", line) for line in launchers(source)), source
    if rows > 64:  # the weight and bias gradients: column sums over the rows, split
        assert "split reduction over outer" in source, source


def gelu_backward_and_bias_gradient(grad, h):
    """GELU's backward (erf form) on bf16 activations, stored for the matmul before it, and its column sum: the
    gradient of that matmul's bias."""
    grad_h = aten.gelu_backward(grad, h)
    return grad_h, wide(grad_h).sum(0)


@pytest.mark.parametrize("rows, width, dtype", shapes_and_dtypes({"odd-width": (ROWS, 100), "wide": (300, 1000),
                                                                   "short": (90, 40)}))
def test_gelu_backward_stores_and_sums_its_columns_in_one_split_kernel(rows, width, dtype):
    grad, h = torch.randn(rows, width).to(dtype), torch.randn(rows, width).to(dtype)
    source = compiled_and_checked(gelu_backward_and_bias_gradient, grad, h)
    if rows < 128:  # too few rows to share: one looped kernel
        assert source.count("@triton.jit") == 1 and "looped kernel" in source, source
        return
    assert source.count("@triton.jit") == 2, source  # the partial pass and the combine of one kernel
    partial = next(line for line in launchers(source) if "_partial = Launcher(" in line)
    xblock, rsplit, rchunk = (int(re.search(rf"{k}=(\d+)", partial).group(1)) for k in ("XBLOCK", "RSPLIT", "RCHUNK"))
    assert xblock == min(64, 1 << (width - 1).bit_length()), partial
    assert (rsplit - 1) * rchunk < rows <= rsplit * rchunk, partial


def channels_last(shape, dtype):
    return torch.randn(shape).to(dtype).contiguous(memory_format=torch.channels_last)


# CI runs the first dtype (KILN_MATRIX_SWEEP=1: both): the kernels' shape is the same in either, and the
# interpreter's seconds go to the reduction, not the casts (bf16 casts run in the other Triton tests)
@pytest.mark.sampled(every=2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_batch_norm_backward_over_channels_last_activations(dtype):
    """Batch norm's backward over NHWC: per channel (a column of N*H*W rows), the sums of the gradient and
    of the gradient times the normalized input, split over the rows; a channel count that fills no tile."""
    def backward(grad, x, weight, mean, invstd):
        return aten.native_batch_norm_backward(wide(grad), wide(x), weight, None, None, mean, invstd, True, 1e-5,
                                               [True, True, True])

    shape = (6, 40, 15, 13)
    grad, x = channels_last(shape, dtype), channels_last(shape, dtype)
    _, mean, invstd = aten.native_batch_norm(x.float(), None, None, None, None, True, 0.1, 1e-5)
    source = compiled_and_checked(backward, grad, x, torch.randn(40), mean, invstd)
    assert "split reduction over outer (40)" in source, source


def test_a_column_reduction_read_back_by_its_rows_loops_narrow_tiles():
    """Centring by a column mean computed in the same kernel (a later segment reads the mean back) cannot
    split its rows: the kernel loops, over tiles narrowed to 16 columns so that more programs share the work."""
    def centred_sums(x):
        centred = wide(x) - wide(x).mean(0)
        return (centred * centred).sum(0), centred.abs().amax(0)

    source = compiled_and_checked(centred_sums, torch.randn(1500, 200))
    assert "split" not in source and "XBLOCK=16" in source, source


# CI runs the first dtype (KILN_MATRIX_SWEEP=1: both): the kernels' shape is the same in either, and the
# interpreter's seconds go to the reduction, not the casts (bf16 casts run in the other Triton tests)
@pytest.mark.sampled(every=2)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_softmax_over_a_strided_dim_reads_its_columns_once(dtype):
    """A softmax over dim 0 reduces a strided dim twice (the max, then the sum of exponentials, which reads the
    max back): its columns stay in one block (persistent), read once, where a loop would read them twice."""
    source = compiled_and_checked(lambda x: torch.softmax(wide(x), 0).to(x.dtype), torch.randn(300, 70).to(dtype))
    assert "persistent kernel over outer (70) x inner (300)" in source, source


def test_a_split_with_a_chunk_count_that_is_not_a_power_of_two():
    """The combine kernel reads the next power of two of partials, masked (the padding lanes read each
    reduction's identity, Welford's an empty partial): 5 chunks of 192 rows here. Seeded: a column whose sum
    cancels to near zero makes the output-relative tolerance tighter than the summation order's error."""
    x = torch.randn(900, 20, generator=torch.Generator().manual_seed(0))
    source = compiled_and_checked(lambda x: (x.sum(0), x.amax(0), torch.var_mean(x, 0)), x)
    assert re.search(r"RSPLIT=5, SBLOCK=8", source), source


def test_an_empty_partial_merges_as_nothing_beside_a_mean_near_1e30():
    """Welford's merge of a partial with an empty one (the combine kernel's padding lanes: 5 chunks read as 8)
    computed `delta * delta * 0`: NaN where delta squared overflows float32 (a column holding 1e30), where eager's
    merge skips the empty side and the variance is inf (GPU fuzz seed 490419: kiln NaN, eager inf)."""
    x = torch.randn(900, 20, generator=torch.Generator().manual_seed(0))
    x[3, 2] = 1e30
    compiled, inputs, _ = compile_for_triton(lambda x: torch.var_mean(x, 0), x)
    assert "RSPLIT=5, SBLOCK=8" in compiled.artefacts["kernels.py"]
    with torch.no_grad():
        variance, mean = compiled(*inputs)
    expected_variance, expected_mean = torch.var_mean(inputs[0], 0)
    assert variance[2].isinf() and expected_variance[2].isinf()
    torch.testing.assert_close((variance, mean), (expected_variance, expected_mean), rtol=1e-4, atol=1e-4)


def test_max_autotune_tries_other_column_tiles_and_split_targets():
    """Under max-autotune a column sum's candidates include other tile widths (32 and 128 columns) and split
    targets beside the rules' choice; whichever the timer picks (here the last one timed) equals eager."""
    from codegen.test_mm_template import build
    from kiln.codegen import triton as triton_target
    from kiln.config import validate_options

    def bias_gradient(x):
        return (x * 2).sum(0)

    timed = itertools.count()
    x = torch.randn(900, 200).to(DEVICE)
    triton_target._loaded.clear()  # no decision held by a kernel module another test loaded
    options = validate_options("max-autotune-no-cudagraphs", {"cpu_backend": "triton"})
    call, sched, namespace, _ = build(bias_gradient, [x], options, lambda label, run: (run(), 100.0 - next(timed))[1])
    torch.testing.assert_close(call(x)[0], bias_gradient(x), atol=1e-4, rtol=1e-5)
    (group,) = sched.kernels()
    labels = list(namespace[group.name].candidates)
    assert labels[0].startswith("split XBLOCK=64"), labels
    assert any(label.startswith("split XBLOCK=32") for label in labels), labels
    assert any(label.startswith("split XBLOCK=128") for label in labels), labels
