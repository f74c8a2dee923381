"""What eager computes on the CPU inside a graph whose tensors are on a GPU.

A program on GPU inputs may make CPU tensors along the way: `torch.bernoulli(torch.full((4,), 0.5))` or
`torch.empty(2, 3).random_(-3, 100)` (no device: the CPU, drawn from the CPU's generator), a 0-d scale
`torch.tensor(d) ** 0.5`. Eager runs those ops on the CPU: a draw takes the CPU generator's numbers and moves its
state, which the program's next CPU draw depends on. Computed on the GPU instead, the draw would take the GPU's
generator, and the CPU's would stay where it was.

So the lowering runs each op whose value is on the CPU, and each op that reads a CPU tensor with dims (the copy
of it to the GPU, an index by CPU indices), as an ATen call on the tensors eager has (`host_work`). A 0-d CPU
value that a GPU kernel reads, computed in the graph or a graph input, crosses to the GPU as a copy
(`crosses_to`); eager's kernel takes it as a scalar, and kiln/lower/scalar_operands.py reads it as that kernel
does (kiln/runtime/host_scalars.py returns 0-d CPU outputs on the host).
"""
from __future__ import annotations

import torch
import torch.fx
from torch.utils._pytree import tree_leaves

from kiln.runtime.host_scalars import is_host_scalar


def host_work(gm: torch.fx.GraphModule) -> frozenset[str]:
    """The names of the nodes of `gm` that run on the CPU as ATen calls: none where no tensor of the graph is on
    a GPU (the C++ target computes CPU values itself)."""
    nodes = [n for n in gm.graph.nodes if n.op in ("placeholder", "call_function")]
    if not any(t.device.type == "cuda" for n in nodes for t in _tensors(n)):
        return frozenset()
    return frozenset(n.name for n in nodes if n.op == "call_function" and (
        any(t.device.type == "cpu" for t in _tensors(n))
        or any(t.device.type == "cpu" and t.dim() > 0 for a in n.all_input_nodes for t in _tensors(a))))


def crosses_to(arg: torch.fx.Node, reader_value, host: frozenset[str]) -> torch.device | None:
    """The GPU that `arg`'s value must be copied to for its reader (whose value is `reader_value`): where `arg`
    is a 0-d CPU value (an input, or computed in the graph: `host`) and the reader computes on a GPU; else None."""
    if not (arg.op == "placeholder" or arg.name in host) or not is_host_scalar(arg.meta.get("val")):
        return None
    devices = [t.device for t in tree_leaves(reader_value) if isinstance(t, torch.Tensor)]
    return devices[0] if devices and devices[0].type == "cuda" else None


def _tensors(node: torch.fx.Node) -> list[torch.Tensor]:
    return [t for t in tree_leaves(node.meta.get("val")) if isinstance(t, torch.Tensor)]
