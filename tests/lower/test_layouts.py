"""Layouts the lowering chooses on the GPU: channels-last convolutions in inference graphs.

The IR checks run anywhere (the lowering is told it targets the GPU); the end-to-end check needs a
CUDA device (KILN_TRITON_TEST_DEVICE=cuda)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kiln.codegen import compile_aten_graph
from kiln.config import validate_options
from kiln.lower import ir, lower_graph
from lower.helpers import assert_same, trace


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_channels_last_inference_graph_on_gpu():
    inputs = conv_inputs("cuda")
    gm = trace(conv_net, *inputs)
    gm.meta["kiln.aot"] = {"kind": "inference", "name": "graph0"}
    compiled = compile_aten_graph(gm, inputs, validate_options(None, None))
    assert "fallback" not in compiled.artefacts
    assert "(256, 1, 32, 4)" in compiled.artefacts["wrapper.py"], compiled.artefacts["wrapper.py"]
    assert_same(compiled(*inputs), conv_net(*inputs))
