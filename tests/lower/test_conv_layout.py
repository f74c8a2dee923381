"""Channels-last convolutions in training graphs (kiln/lower/conv_layout.py): which graphs run them, and a
training step whose forward and backward both do, compared with eager.

On the GPU a depthwise convolution in NCHW runs ATen's generic kernels; channels-last runs cuDNN's. The rule
picks the layout per graph as Inductor's does; a forward that runs channels-last returns the activations it
saves for the backward in that layout, and the backward is compiled for them, so nothing between a batch
norm and a convolution is transposed. The rule's decision is checked on traced graphs; the training step
runs on the CPU's C++ target with the GPU's decision forced (`runs_channels_last`), which exercises the same
lowering and the same forward-to-backward layout hand-over, and compares values and gradients with eager.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln import pipeline
from kiln.lower import ir
from kiln.lower.conv_layout import channels_last_values, prefers_channels_last
from kiln.lower.graph import channels_last_strides
from support.lowering import trace


def convs(*weights, groups=None, dtype=torch.float32, n=2, hw=8):
    """A traced graph of 2-d convolutions in a chain, one per weight shape (with its groups)."""
    groups = groups or [1] * len(weights)
    params = [torch.randn(w, dtype=dtype) for w in weights]
    x = torch.randn(n, weights[0][1] * groups[0], hw, hw, dtype=dtype)

    def fn(x, *ws):
        for w, g in zip(ws, groups):
            x = F.relu(F.conv2d(x, w, padding=w.shape[-1] // 2, groups=g))
        return x

    return trace(fn, x, *params)


def test_depthwise_and_pointwise_convolutions_run_channels_last_in_training():
    """MobileNet's block: a 1x1 expansion and a depthwise 3x3 (one input channel per group)."""
    gm = convs((96, 16, 1, 1), (96, 1, 3, 3), groups=[1, 96])
    assert prefers_channels_last(gm, inference=False)
    assert prefers_channels_last(gm, inference=True)


@pytest.mark.parametrize("case, weights, groups", [
    ("grouped with several channels per group", [(128, 16, 1, 1), (128, 32, 3, 3)], [1, 4]),
    ("fewer outputs than inputs through a 3x3", [(128, 16, 1, 1), (32, 128, 3, 3)], [1, 1]),
    ("every convolution small", [(32, 16, 1, 1), (32, 32, 3, 3)], [1, 1]),
])
def test_training_graphs_keep_eager_layout_where_channels_last_measured_slower(case, weights, groups):
    assert not prefers_channels_last(convs(*weights, groups=groups), inference=False), case


def test_inference_weighs_convolutions_by_their_flops():
    """Grouped convolutions (slower channels-last) decide an inference graph only where they hold most of
    its FLOPs: a cheap 1x1 before a heavy grouped 3x3 keeps eager's layout, the other way round does not."""
    grouped_heavy = convs((128, 16, 1, 1), (128, 32, 3, 3), groups=[1, 4])
    assert not prefers_channels_last(grouped_heavy, inference=True)
    dense_heavy = convs((512, 16, 3, 3), (64, 256, 1, 1), groups=[1, 2])
    assert prefers_channels_last(dense_heavy, inference=True)


def test_float64_and_graphs_without_convolutions_keep_eager_layout():
    assert not prefers_channels_last(convs((96, 16, 1, 1), (96, 1, 3, 3), groups=[1, 96], dtype=torch.float64),
                                     inference=False)
    assert not prefers_channels_last(trace(lambda x: x.relu() * 2, torch.randn(2, 3, 4, 4)), inference=False)


def test_a_lone_convolution_among_many_ops_keeps_eager_layout():
    """A vision transformer's patch embedding: one convolution in a graph of hundreds of ops."""
    w = torch.randn(96, 16, 4, 4)

    def patch_embed_then_many_ops(x, w):
        y = F.conv2d(x, w, stride=4)
        for _ in range(200):
            y = y * 1.01 + 0.5
        return y

    gm = trace(patch_embed_then_many_ops, torch.randn(2, 16, 16, 16), w)
    assert not prefers_channels_last(gm, inference=False)


def test_a_permuted_value_leaves_the_channels_last_path():
    """ConvNeXt's block: the depthwise convolution's result permuted to [N, H, W, C] for a layer norm and an MLP,
    permuted back and added to the residual read by the next convolution. The values in [N, H, W, C] are off the
    channels-last path (stored as they are; channels-last of that shape would put H last); the residual sum and
    the permuted-back MLP output are on it."""
    n, c, hw = 2, 16, 8

    def convnext_block(x, w_dw, w1, w2, w_next):
        y = F.conv2d(x, w_dw, padding=3, groups=c).permute(0, 2, 3, 1)
        y = F.linear(F.gelu(F.linear(F.layer_norm(y, (c,)), w1)), w2).permute(0, 3, 1, 2)
        return F.conv2d(x + y, w_next)

    inputs = [torch.randn(n, c, hw, hw), torch.randn(c, 1, 7, 7), torch.randn(4 * c, c), torch.randn(c, 4 * c),
              torch.randn(c, c, 1, 1)]
    gm = trace(convnext_block, *inputs)
    preferred = channels_last_values(gm)
    shapes = {tuple(node.meta["val"].shape) for node in preferred if isinstance(node.meta.get("val"), torch.Tensor)}
    assert (n, hw, hw, c) not in shapes and (n, hw, hw, 4 * c) not in shapes, shapes
    convs = list(gm.graph.find_nodes(op="call_function", target=torch.ops.aten.convolution.default))
    assert convs[-1].args[0] in preferred  # the residual sum the next convolution reads


class InvertedResidual(nn.Module):
    """MobileNetV3's block: expand (1x1), depthwise (3x3), project (1x1), each with batch norm, and a residual."""

    def __init__(self, channels=16, expanded=96):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(channels, expanded, 1, bias=False), nn.BatchNorm2d(expanded),
                                    nn.Hardswish())
        self.depthwise = nn.Sequential(nn.Conv2d(expanded, expanded, 3, padding=1, groups=expanded, bias=False),
                                       nn.BatchNorm2d(expanded), nn.Hardswish())
        self.project = nn.Sequential(nn.Conv2d(expanded, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        y = x.relu()  # the block's input is an activation of the step, as inside a network
        return (y + self.project(self.depthwise(self.expand(y)))).square().mean()


class ResNetStem(nn.Module):
    """ResNet's stem (7x7 convolution, batch norm, relu, max pool) and a basic block with its residual; the
    step's input is an image (contiguous), written channels-last for the first convolution."""

    def __init__(self, channels=80):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 7, 2, 3, bias=False), nn.BatchNorm2d(channels),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.block = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                                   nn.BatchNorm2d(channels), nn.ReLU(),
                                   nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x):
        y = self.stem(x)
        return (y + self.block(y)).relu().mean((2, 3)).square().mean()


STEPS = {"mobilenet block": (InvertedResidual, (2, 16, 8, 8)), "resnet stem": (ResNetStem, (2, 3, 16, 16))}


@pytest.fixture
def channels_last_on_cpu(monkeypatch):
    """The GPU's layout decision on the CPU target."""
    monkeypatch.setattr(pipeline, "runs_channels_last",
                        lambda gm, target: prefers_channels_last(gm, pipeline._is_inference(gm)))


def run_step(name: str, compiled_graphs: list, device: str = "cpu"):
    """(compiled graphs, eager's and kiln's loss, eager's and kiln's gradients, the models, the step's input
    shape) of one training step of STEPS[name]."""
    torch.manual_seed(0)
    make, shape = STEPS[name]
    model, x = make().to(device), torch.randn(shape, device=device)
    twin = make().to(device)
    twin.load_state_dict(model.state_dict())
    expected = model(x)
    expected.backward()
    got = kiln.compile(twin)(x)
    got.backward()
    grads = [(p.grad, q.grad) for p, q in zip(model.parameters(), twin.parameters())]
    return list(compiled_graphs), (expected, got), grads, (model, twin), x.shape


@pytest.fixture(params=list(STEPS))
def training_step(request, channels_last_on_cpu, compiled_graphs):
    return run_step(request.param, compiled_graphs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(STEPS))
def test_training_step_on_the_gpu_matches_eager(name, compiled_graphs):
    """On the GPU kiln decides the layout itself; cuDNN's channels-last and NCHW algorithms round differently
    (TF32 included), so the tolerance is loose: a wrong layout gives wrong values, not rounding."""
    graphs, (expected, got), grads, (model, twin), _ = run_step(name, compiled_graphs, "cuda")
    assert graphs[0].restrided_outputs, "the forward saves its activations channels-last"
    torch.testing.assert_close(got, expected, atol=1e-2, rtol=1e-2)
    for g_eager, g_kiln in grads:
        torch.testing.assert_close(g_kiln, g_eager, atol=1e-2, rtol=1e-2)


def test_training_step_through_channels_last_convolutions_matches_eager(training_step):
    _, (expected, got), grads, (model, twin), _ = training_step
    torch.testing.assert_close(got, expected)
    for g_eager, g_kiln in grads:
        torch.testing.assert_close(g_kiln, g_eager)
        # parameter gradients keep the parameters' layout (size-1 dims have no stride that matters)
        assert [s for n, s in zip(g_kiln.shape, g_kiln.stride()) if n > 1] == \
            [s for n, s in zip(g_eager.shape, g_eager.stride()) if n > 1]
    for (name, b_eager), b_kiln in zip(model.named_buffers(), twin.buffers()):
        torch.testing.assert_close(b_kiln, b_eager, msg=name)  # running statistics


def _conv_externs(graph: ir.LoweredGraph) -> list[ir.Extern]:
    ops = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)
    return [n for n in graph.nodes if isinstance(n, ir.Extern) and n.op in ops]


def _activation_copies(graph: ir.LoweredGraph, image: torch.Size) -> list[ir.ComputedBuffer]:
    """Kernels that only copy (transpose) an activation (a tensor of the size of a convolution's input or
    output, not a weight), but for the step's input `image`."""
    activations = {torch.Size(a.layout.size).numel() for e in _conv_externs(graph) for a in e.args[:3]
                   if isinstance(a, ir.TensorRef) and a.layout.size[0] == image[0]} - {image.numel()}
    return [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer) and isinstance(n.data, ir.Pointwise)
            and isinstance(n.data.body, ir.Load)
            and torch.Size(n.layout.size).numel() in activations]


def test_forward_and_backward_convolutions_read_and_write_channels_last(training_step):
    """Every convolution, forward and backward, takes its 4-d operands channels-last and gives its results
    so; the forward returns its saved activations channels-last and the backward takes them as they are; no
    kernel transposes an activation (between a batch norm and a convolution, or a saved activation for the
    backward's convolutions). The copies allowed are of the step's input, an NCHW image written channels-last
    for the first convolution (as torch.compile writes it; the backward reads the input again, as saving it
    costs no memory)."""
    graphs, *_, image = training_step
    forward, backward = [g for g in graphs if g.artefacts["name"].endswith(("forward", "backward"))]
    assert forward.restrided_outputs, "the forward saves activations channels-last"
    for g in (forward, backward):
        graph = g.artefacts["ir"]
        externs = _conv_externs(graph)
        assert len(externs) == 3
        for e in externs:
            for ref in e.args[:3]:
                if isinstance(ref, ir.TensorRef) and len(ref.layout.size) == 4:
                    assert _is_channels_last(ref.layout), (e.op, ref)
        copies = _activation_copies(graph, image)
        assert not copies, [c.name for c in copies]
    activations = [i for i in backward.artefacts["ir"].inputs if isinstance(i, ir.InputBuffer)
                   and len(i.layout.size) == 4 and i.layout.size[0] == image[0]]  # not weights, batch statistics
    saved = [i for i in activations if _is_channels_last(i.layout)]
    assert len(saved) == len(forward.restrided_outputs)
    assert [tuple(i.layout.size) for i in activations if i not in saved] in ([], [tuple(image)])  # the step's input


def _is_channels_last(layout: ir.Layout) -> bool:
    return all(n == 1 or a == b for n, a, b in zip(layout.size, layout.stride, channels_last_strides(layout.size)))
