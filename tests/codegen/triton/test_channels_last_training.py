"""A MobileNetV3-style training step compiled for the GPU (fake CUDA tensors, nothing launched): kiln's own
layout decision runs its convolutions channels-last in the forward and in the backward, in bf16 autocast, and
no kernel transposes an activation. On the GPU the NCHW depthwise convolutions ran ATen's generic
`conv_depthwise2d_*` kernels and cuDNN transposed around the others; channels-last runs cuDNN's NHWC kernels.
Values are checked on the CPU target (tests/lower/test_conv_layout.py); here the GPU's decision and kernels."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

pytest.importorskip("triton")

from kiln.lower import ir  # noqa: E402
from kiln.lower.graph import channels_last_strides  # noqa: E402
from support.fake_cuda import compile_model  # noqa: E402
from support.triton_sm90 import recording_builds  # noqa: E402

BATCH = 4


class MobileBlock(nn.Module):
    """A stem convolution, then expand (1x1), depthwise (3x3), squeeze-excite and project (1x1), each with batch
    norm, and a residual; the loss as the zoo's training steps take it (fp32, from the bf16 logits)."""

    def __init__(self, channels=32, expanded=128):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, 2, 1, bias=False), nn.BatchNorm2d(channels),
                                  nn.Hardswish())
        self.expand = nn.Sequential(nn.Conv2d(channels, expanded, 1, bias=False), nn.BatchNorm2d(expanded),
                                    nn.Hardswish())
        self.depthwise = nn.Sequential(nn.Conv2d(expanded, expanded, 3, padding=1, groups=expanded, bias=False),
                                       nn.BatchNorm2d(expanded), nn.Hardswish())
        self.excite = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(expanded, 32, 1), nn.ReLU(),
                                    nn.Conv2d(32, expanded, 1), nn.Hardsigmoid())
        self.project = nn.Sequential(nn.Conv2d(expanded, channels, 1, bias=False), nn.BatchNorm2d(channels))
        self.head = nn.Linear(channels, 10)

    def forward(self, x):
        y = self.stem(x)
        z = self.depthwise(self.expand(y))
        y = y + self.project(z * self.excite(z))
        return self.head(y.mean((2, 3))).float().square().mean()


def _is_channels_last(layout: ir.Layout) -> bool:
    return all(n == 1 or a == b for n, a, b in zip(layout.size, layout.stride, channels_last_strides(layout.size)))


def test_training_step_runs_its_convolutions_channels_last_on_the_gpu():
    with recording_builds():  # kernels built as for a GPU, not launched
        forward, backward = compile_model(MobileBlock(), [torch.randn(BATCH, 3, 32, 32)], train=True,
                                          amp=torch.bfloat16, name="graph_mobile")
    assert forward.restrided_outputs, "the forward saves its activations channels-last"
    for graph in (forward.artefacts["ir"], backward.artefacts["ir"]):
        convs = [n for n in graph.nodes if isinstance(n, ir.Extern)
                 and n.op in (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)]
        assert len(convs) == 6
        operands = [a for c in convs for a in c.args[:3] if isinstance(a, ir.TensorRef) and len(a.layout.size) == 4]
        assert all(_is_channels_last(a.layout) for a in operands), [a for a in operands
                                                                    if not _is_channels_last(a.layout)]
        activation_copies = [n for n in graph.nodes if isinstance(n, ir.ComputedBuffer)
                             and isinstance(n.data, ir.Pointwise) and isinstance(n.data.body, ir.Load)
                             and int(n.layout.size[0]) == BATCH]
        assert not activation_copies, [n.name for n in activation_copies]

