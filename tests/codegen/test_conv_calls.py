"""The convolutions a lowered graph's wrapper calls, described so that the compile can make each call once ahead
of the first step (kiln/runtime/cudnn_warmup.py): exactly the layouts the wrapper passes, none with a symbolic
size."""
from __future__ import annotations

import sympy
import torch
import torch.nn.functional as F

from kiln.codegen.conv_calls import convolution_calls
from kiln.lower import ir, lower_graph
from kiln.runtime.cudnn_warmup import ScratchTensor
from support.lowering import trace

aten = torch.ops.aten


def conv_net(x, w1, b1, w2):
    y = F.relu(F.conv2d(x, w1, b1, padding=1)) * 2
    return F.conv2d(y, w2).sum((2, 3))


def conv_inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in [(2, 3, 8, 8), (4, 3, 3, 3), (4,), (5, 4, 1, 1)]]


def test_each_convolution_is_described_with_the_layouts_the_wrapper_passes():
    inputs = conv_inputs()
    graph = lower_graph(trace(conv_net, *inputs), inputs, channels_last_convs=True)
    calls = convolution_calls(graph)
    externs = [n for n in graph.nodes if isinstance(n, ir.Extern) and n.op is aten.convolution.default]
    assert len(calls) == len(externs) == 2
    first = calls[0].args
    assert first[0] == ScratchTensor((2, 3, 8, 8), (192, 1, 24, 3), 0, torch.float32)  # channels-last input
    assert first[1].size == (4, 3, 3, 3) and first[1].stride == (27, 1, 9, 3)
    assert first[2] is None  # the bias is added apart, in the kernel after the convolution
    assert first[3:] == ((1, 1), (1, 1), (1, 1), False, (0, 0), 1)
    for call in calls:  # each makes a convolution of the graph's output sizes
        out = call.op(*[a.make(torch.device("cpu")) if isinstance(a, ScratchTensor) else a for a in call.args])
        assert out.shape in {(2, 4, 8, 8), (2, 5, 8, 8)}


def test_a_backward_graph_describes_its_convolution_backward():
    g = torch.Generator().manual_seed(0)
    grad, x, w = (torch.randn(s, generator=g) for s in [(2, 4, 8, 8), (2, 3, 8, 8), (4, 3, 3, 3)])

    def backward(grad, x, w):
        return aten.convolution_backward.default(grad, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                 [True, True, False])[:2]
    graph = lower_graph(trace(backward, grad, x, w), [grad, x, w], channels_last_convs=True)
    (call,) = convolution_calls(graph)
    assert call.op is aten.convolution_backward.default
    assert [a.stride for a in call.args[:3]] == [(256, 1, 32, 4), (192, 1, 24, 3), (27, 1, 9, 3)]
    assert call.args[-1] == (True, True, False)
    made = call.op(*[a.make(torch.device("cpu")) if isinstance(a, ScratchTensor) else a for a in call.args])
    assert made[0].shape == x.shape and made[1].shape == w.shape


def test_a_convolution_of_symbolic_sizes_is_left_out():
    s0 = sympy.Symbol("s0", positive=True, integer=True)
    x = ir.Layout((s0, 3, 8, 8), (192, 64, 8, 1), torch.float32)
    w = ir.Layout.contiguous((4, 3, 3, 3), torch.float32)
    conv = ir.Extern("buf0", aten.convolution.default,
                     (ir.TensorRef("arg0", x), ir.TensorRef("arg1", w), None, [1, 1], [0, 0], [1, 1], False, [0, 0],
                      1), {}, ir.Layout.contiguous((s0, 4, 6, 6), torch.float32))
    graph = ir.LoweredGraph([ir.InputBuffer("arg0", x), ir.InputBuffer("arg1", w)], [conv],
                            [ir.TensorRef("buf0", conv.layout)])
    assert convolution_calls(graph) == []
