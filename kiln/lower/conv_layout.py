"""Which GPU graphs run their 2-d convolutions channels-last, and which of their values prefer that layout.

cuDNN's kernels are channels-last (NHWC) kernels: an NCHW convolution transposes its input and output around
them, and ATen runs a depthwise NCHW convolution in bf16 or fp16 through its own generic kernels
(`conv_depthwise2d_*`), several times slower than cuDNN's NHWC ones. A graph whose convolutions run
channels-last stores the values around them in that layout too, so that the batch-norm and activation
kernels between two convolutions read and write it without a transpose.

The rule is Inductor's (`GraphLowering.decide_layout_opt`), written over kiln's graphs, forward and backward:
`aten.convolution` in a forward or inference graph, `aten.convolution_backward` in a backward graph (whose
saved activations the forward returns channels-last, kiln/autograd/aot.py). Channels-last is kept off where
it measured slower there: grouped convolutions with more than one input channel per group, convolutions
with fewer output than input channels and a kernel wider than 1x1, graphs whose convolutions all have
few channels, graphs with a lone convolution among many other ops (a vision transformer's patch
embedding), dynamic sizes, and float64 (cuDNN has no NHWC kernels for it). An inference graph weighs its
convolutions by their FLOPs instead, with the measured speedup of each kind.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx

aten = torch.ops.aten

# Positions of (input, weight, transposed, groups) in each convolution op's arguments.
_CONV_ARGS = {aten.convolution.default: (0, 1, 6, 8), aten.convolution_backward.default: (1, 2, 7, 9)}
# A graph with this many ops per convolution or more keeps eager's layout (few convolutions among many ops).
MAX_NODES_PER_CONV = 300
# Inference: each kind of convolution's time channels-last over NCHW (Inductor's measurements; < 1 is faster).
CHANNELS_LAST_COST = {"grouped": 1.358, "small": 0.783, "in_out": 0.725, "default": 0.823}


@dataclass(frozen=True)
class Conv:
    """A 2-d convolution of the graph: its weight's sizes, its groups, its output's pixels (batch x height x
    width) and its input's dtype."""

    weight: tuple[int, ...]
    groups: int
    output_pixels: int
    dtype: torch.dtype

    @property
    def grouped(self) -> bool:
        """Several input channels per group (a depthwise convolution has one: channels-last suits it)."""
        return self.groups > 1 and self.weight[1] > 1

    @property
    def narrowing(self) -> bool:
        """Half the input channels or fewer out, through a kernel wider than 1x1."""
        return self.weight[0] * 2 <= self.weight[1] and self.weight[2] > 1

    @property
    def small(self) -> bool:
        return self.weight[0] <= 64 and self.weight[1] <= 64

    @property
    def kind(self) -> str:
        return "grouped" if self.grouped else "small" if self.small else "in_out" if self.narrowing else "default"

    @property
    def flops(self) -> int:
        out_channels, in_per_group, kh, kw = self.weight
        return 2 * self.output_pixels * out_channels * in_per_group * kh * kw


def conv2d_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The graph's convolution and convolution-backward nodes over 4-d tensors, not transposed."""
    out = []
    for op, (_, w, transposed, _) in _CONV_ARGS.items():
        for node in gm.graph.find_nodes(op="call_function", target=op):
            weight = _meta(node.args[w])
            if weight is not None and weight.dim() == 4 and not node.args[transposed]:
                out.append(node)
    return out


def prefers_channels_last(gm: torch.fx.GraphModule, inference: bool) -> bool:
    """Whether `gm` (a GPU graph) runs its 2-d convolutions channels-last (the module docstring's rule)."""
    nodes = conv2d_nodes(gm)
    convs = [c for c in map(_conv, nodes) if c is not None]
    if not convs or len(convs) < len(nodes):  # none, or one with dynamic sizes
        return False
    if len(gm.graph.nodes) >= MAX_NODES_PER_CONV * len(convs) or any(c.dtype == torch.float64 for c in convs):
        return False
    if inference:
        return _faster_by_flops(convs)
    return not (any(c.grouped for c in convs) or any(c.narrowing for c in convs) or all(c.small for c in convs))


def _faster_by_flops(convs: list[Conv]) -> bool:
    """Whether the convolutions' FLOPs, each weighted by its kind's cost channels-last, add up to no more
    than they do in NCHW."""
    total = sum(c.flops for c in convs)
    return sum(c.flops * CHANNELS_LAST_COST[c.kind] for c in convs) <= total


def channels_last_values(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """The nodes whose values prefer channels-last in a graph whose convolutions run so: every value a
    convolution reads, directly or through other ops, and every value computed from one of those (the
    chain conv -> batch norm -> activation -> conv, forward and backward, in one layout) -- along paths on
    which a 4-d value's dims keep their meaning (N, C, H, W). A permute, a reshape or a view ends the path:
    ConvNeXt's block permutes its convolution's result to [N, H, W, C] for a layer norm and linear layers,
    whose values are best stored in that order as they are (channels-last of that shape would put H last)."""
    convs = set(conv2d_nodes(gm))
    upstream: set[torch.fx.Node] = set()
    for node in reversed(gm.graph.nodes):
        if node in convs or any(u in upstream and _keeps_dims(node, u) for u in node.users):
            upstream.add(node)
    preferred = set(upstream)
    for node in gm.graph.nodes:
        if node in preferred:
            preferred.update(u for u in node.users if _keeps_dims(node, u))
    return preferred


# Ops whose result's dims are not its input's dims (in another order, merged, split, added or taken away).
_REARRANGING = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default, aten.transpose.int,
    aten.t.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
    aten.select.int, aten.as_strided.default, aten.unfold.default, aten.pixel_shuffle.default,
    aten.pixel_unshuffle.default, aten.channel_shuffle.default, aten.flatten.using_ints, aten.unflatten.int})


def _keeps_dims(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    """Whether `user` computes from `node` a value whose dims are `node`'s (a pointwise op, a batch norm's
    pieces, pooling, a convolution, an item of a tuple result), both 4-d."""
    if user.op != "call_function" or user.target in _REARRANGING:
        return False
    value, out = node.meta.get("val"), user.meta.get("val")
    if user.target is operator.getitem:
        return isinstance(out, torch.Tensor) and out.dim() == 4
    if isinstance(out, (tuple, list)):  # a convolution's backward, a pooling with its indices
        return isinstance(value, torch.Tensor) and value.dim() == 4
    return (isinstance(value, torch.Tensor) and isinstance(out, torch.Tensor) and value.dim() == 4
            and out.dim() == 4)


def _conv(node: torch.fx.Node) -> Conv | None:
    """The convolution `node` computes, or None where a size is symbolic."""
    x, w, _, groups = _CONV_ARGS[node.target]
    inp, weight = _meta(node.args[x]), _meta(node.args[w])
    out = _meta(node) if node.target is aten.convolution.default else _meta(node.args[0])  # the grad_output
    if inp is None or out is None or out.dim() != 4:
        return None
    sizes = (*inp.shape, *weight.shape, *out.shape)
    if not all(isinstance(s, int) for s in sizes) or not isinstance(node.args[groups], int):
        return None
    return Conv(tuple(weight.shape), node.args[groups], out.shape[0] * out.shape[2] * out.shape[3], inp.dtype)


def _meta(arg) -> torch.Tensor | None:
    value = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None
