"""Layouts the lowering chooses on the GPU: channels-last convolutions in inference graphs.

The IR checks run anywhere (the lowering is told it targets the GPU); the end-to-end check needs a
CUDA device (KILN_TRITON_TEST_DEVICE=cuda)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.config import validate_options
from kiln.lower import ir, lower_graph
from kiln.pipeline import compile_aten_graph
from support.lowering import assert_same, trace


def conv_net(x, w1, b1, w2):
    y = F.relu(F.conv2d(x, w1, b1, padding=1)) * 2
    return F.conv2d(y, w2).sum((2, 3))


def conv_inputs(device="cpu"):
    g = torch.Generator().manual_seed(0)
    shapes = [(2, 3, 8, 8), (4, 3, 3, 3), (4,), (5, 4, 1, 1)]
    return [torch.randn(s, generator=g).to(device) for s in shapes]


def test_convolutions_run_channels_last_and_the_kernels_between_use_that_layout():
    """The input and the 3x3 weight are written channels-last once; the 1x1 weight already is (its
    strides differ only on size-1 dims); each convolution's result is channels-last, and the pointwise
    kernel between the two reads and writes that layout in memory order."""
    inputs = conv_inputs()
    graph = lower_graph(trace(conv_net, *inputs), inputs, channels_last_convs=True)
    convs = [n for n in graph.nodes if isinstance(n, ir.Extern)]
    assert [tuple(c.layout.stride) for c in convs] == [(256, 1, 32, 4), (320, 1, 40, 5)]
    copies = [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.name in {convs[0].args[0].buf,
                                                                                       convs[0].args[1].buf}]
    assert len(copies) == 2 and convs[1].args[1].buf == "arg3"
    between = next(n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.name == convs[1].args[0].buf)
    assert tuple(between.data.ranges) == (2, 8, 8, 4)  # N, H, W, C: memory order
    plain = lower_graph(trace(conv_net, *inputs), inputs)
    assert [tuple(c.layout.stride) for c in plain.nodes if isinstance(c, ir.Extern)][0] == (256, 64, 8, 1)


def compile_inference_graph(fn, inputs):
    """`fn` traced and compiled as an inference graph (where the GPU target runs convolutions
    channels-last), without falling back to ATen."""
    gm = trace(fn, *inputs)
    gm.meta["kiln.aot"] = {"kind": "inference", "name": "graph0"}
    compiled = compile_aten_graph(gm, inputs, validate_options(None, None))
    assert "fallback" not in compiled.artefacts
    return compiled


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_channels_last_inference_graph_on_gpu():
    inputs = conv_inputs("cuda")
    compiled = compile_inference_graph(conv_net, inputs)
    assert "(256, 1, 32, 4)" in compiled.artefacts["wrapper.py"], compiled.artefacts["wrapper.py"]
    assert_same(compiled(*inputs), conv_net(*inputs))


def residual_block(x, w1, w2, scale, shift):
    """ResNet's pattern: the block's output (an affine + residual + relu, too many loads to recompute)
    is read by the next convolution and by the next residual add."""
    y = F.relu(F.conv2d(x, w1, padding=1) * scale.view(1, 4, 1, 1) + shift.view(1, 4, 1, 1) + x)
    return F.conv2d(y, w2, padding=1) + y, F.conv2d(x, w1, padding=1)


def test_a_value_read_by_a_convolution_and_a_kernel_is_stored_channels_last_once():
    """The residual stream (read by the next convolution and by the residual add) is stored once in the
    convolutions' layout, not by rows and then copied for the convolution; a convolution's result that is
    also a graph output comes back with eager's strides (the caller may .view() it)."""
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=g) for s in [(2, 4, 6, 6), (4, 4, 3, 3), (4, 4, 3, 3), (4,), (4,)]]
    graph = lower_graph(trace(residual_block, *inputs), inputs, channels_last_convs=True)
    convs = [n for n in graph.nodes if isinstance(n, ir.Extern)]
    second = convs[1]
    stream = next(n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.name == second.args[0].buf)
    assert tuple(stream.data.ranges) == (2, 6, 6, 4)  # stored N, H, W, C and read by the convolution as it is
    residual_add = next(n for n in graph.nodes if isinstance(n, ir.ComputedBuffer)
                        and second.name in {ld.buf for ld in ir.loads(n.data.body)})
    assert stream.name in {ld.buf for ld in ir.loads(residual_add.data.body)}  # the same buffer, no copy
    assert tuple(graph.outputs[1].layout.stride) == (144, 36, 6, 1)  # eager's, not the convolution's


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_residual_block_inference_graph_on_gpu():
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=g).cuda() for s in [(2, 4, 6, 6), (4, 4, 3, 3), (4, 4, 3, 3), (4,), (4,)]]
    compiled = compile_inference_graph(residual_block, inputs)
    got = compiled(*inputs)
    assert got[1].stride() == (144, 36, 6, 1)
    assert_same(got, residual_block(*inputs))


def pooled_stem(x, w0, w1, w2, mean, var, weight, bias):
    """ResNet's stem: the first convolution's batch norm and relu, max-pooled; the pooled value is read by
    the first block's two convolutions."""
    y = F.relu(F.batch_norm(F.conv2d(x, w0, padding=1), mean, var, weight, bias, training=False))
    y = F.max_pool2d(y, 3, 2, 1)
    return F.conv2d(y, w1, padding=1) + F.conv2d(y, w2)


def stem_inputs(device="cpu"):
    g = torch.Generator().manual_seed(0)
    shapes = [(1, 3, 10, 10), (4, 3, 3, 3), (4, 4, 3, 3), (4, 4, 1, 1), (4,), (4,), (4,), (4,)]
    inputs = [torch.randn(s, generator=g) for s in shapes]
    inputs[5] = inputs[5].abs() + 0.5  # a variance
    return [t.to(device) for t in inputs]


def test_a_max_pool_read_by_convolutions_is_stored_channels_last_once_without_its_indices():
    """The pool's values (a tuple item, which bypasses the graph's realize decisions) are written once in
    the convolutions' layout and read by both as they are; the indices, which inference never reads, are
    not computed at all."""
    inputs = stem_inputs()
    graph = lower_graph(trace(pooled_stem, *inputs), inputs, channels_last_convs=True)
    convs = [n for n in graph.nodes if isinstance(n, ir.Extern)]
    pooled = {c.args[0].buf for c in convs[1:]}
    assert len(pooled) == 1
    (pool,) = [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.name in pooled]
    assert tuple(pool.data.ranges) == (1, 5, 5, 4)  # N, H, W, C: memory order
    # what the pool reads (the affine + relu, too big to recompute at each of the 9 taps) is stored in the
    # convolution's layout too, not transposed to rows between two channels-last kernels
    (pool_input,) = {ld.buf for ld in ir.loads(pool.data.body)}
    (stored,) = [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.name == pool_input]
    assert tuple(stored.data.ranges) == (1, 10, 10, 4)
    assert not [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.layout.dtype == torch.int64]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pooled_stem_inference_graph_on_gpu():
    inputs = stem_inputs("cuda")
    compiled = compile_inference_graph(pooled_stem, inputs)
    assert_same(compiled(*inputs), pooled_stem(*inputs))


def test_a_weight_copied_channels_last_is_written_as_three_dims():
    """Stored channels-last, a 3x3 weight [O, I, 3, 3] is written O, 3, 3, I; its two tap dims are one run of
    the loads (kh * 3 + kw), so the copy's loops are [O, 9, I] and its load walks the 9 taps with stride 1.
    A 1x1 weight needs no copy at all."""
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=g) for s in [(1, 6, 5, 5), (8, 6, 3, 3)]]
    graph = lower_graph(trace(lambda x, w: F.conv2d(x, w, padding=1), *inputs), inputs, channels_last_convs=True)
    (conv,) = [n for n in graph.nodes if isinstance(n, ir.Extern)]
    (copy,) = [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.name == conv.args[1].buf]
    assert tuple(copy.data.ranges) == (8, 9, 6)
    i0, i1, i2 = sorted(copy.data.body.index.free_symbols, key=str)
    assert copy.data.body.index == 54 * i0 + i1 + 9 * i2  # o * I*9 + tap + i * 9
    assert tuple(conv.args[1].layout.stride) == (54, 1, 18, 6)  # the convolution still sees [O, I, 3, 3]


def convnext_block(x, w_dw, scale):
    """ConvNeXt's pattern: a channels-last MLP (after a permute and a layer norm, whose result is dense in
    the permuted order) whose result is permuted back and read by the next depthwise convolution; in eager
    that value is channels-last, and cuDNN runs its fast channels-last depthwise kernel on it."""
    y = (F.layer_norm(x.permute(0, 2, 3, 1), (4,)) * scale).relu().permute(0, 3, 1, 2)
    return F.conv2d(y, w_dw, padding=1, groups=4)


def test_an_extern_reads_a_computed_operand_in_the_order_eager_holds_it():
    """Without the channels-last rule of inference graphs (a training graph's), the convolution's computed
    input is stored channels-last, as eager holds it, not copied to rows (where the convolution would run
    its generic kernel); a value eager holds by rows stays by rows."""
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=g) for s in [(2, 4, 6, 6), (4, 1, 3, 3), (4,)]]
    graph = lower_graph(trace(convnext_block, *inputs), inputs)
    (conv,) = [n for n in graph.nodes if isinstance(n, ir.Extern)]
    assert tuple(conv.args[0].layout.stride) == (144, 1, 24, 4)
    (stored,) = [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and n.name == conv.args[0].buf]
    assert tuple(stored.data.ranges) == (2, 6, 6, 4)  # written in memory order
    plain = lower_graph(trace(conv_net, *conv_inputs()), conv_inputs())
    second = [n for n in plain.nodes if isinstance(n, ir.Extern)][1]
    assert tuple(second.args[0].layout.stride) == (256, 64, 8, 1)
    assert_same(compile_aten_graph(trace(convnext_block, *inputs), inputs, validate_options(None, None))(*inputs),
                convnext_block(*inputs))
