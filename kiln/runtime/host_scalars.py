"""0-d CPU tensors in a CUDA graph: moved to the GPU on the way in, back to the host on the way out.

Eager lets a 0-d CPU tensor mix into CUDA ops (a scale `torch.tensor(d) ** 0.5` made without a device, as
DeBERTa's attention does): ATen reads it as a number. Triton kernels read device memory only, so the compiled
graph computes such values on its GPU and takes such inputs there: a copy of 0-d pageable memory, staged
without waiting for the GPU. A 0-d CPU value the caller sees (a graph output) is copied back to the host,
which waits for the GPU; one the forward only saves for its backward stays on the GPU, where the backward
graph reads it (its own host-scalar inputs are then already there). Either beats running the whole graph
through ATen, which is what a graph mixing devices did.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx
import torch.utils._pytree as pytree


def is_host_scalar(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0


def host_scalar_inputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    placeholders = gm.graph.find_nodes(op="placeholder")
    return tuple(k for k, node in enumerate(placeholders) if is_host_scalar(node.meta.get("val")))


def host_scalar_outputs(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """The graph outputs that are 0-d CPU tensors in eager and that the caller sees: a training forward graph's
    outputs past `visible_outputs` are saved for the backward only."""
    (output,) = gm.graph.find_nodes(op="output")
    values = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in pytree.tree_leaves(output.args)]
    visible = gm.meta.get("kiln.aot", {}).get("visible_outputs", len(values))
    return tuple(k for k, value in enumerate(values[:visible]) if is_host_scalar(value))


class HostScalarCall:
    """A compiled CUDA graph's `call` taking its host-scalar inputs to `device` and its host-scalar outputs
    back to the CPU, as eager holds them."""

    def __init__(self, call: Callable, device: str, inputs: tuple[int, ...], outputs: tuple[int, ...]):
        self.call, self.device, self.inputs, self.outputs = call, device, inputs, outputs

    def __call__(self, args: list):
        for k in self.inputs:
            args[k] = args[k].to(self.device, non_blocking=True)
        results = self.call(args)
        if not self.outputs:
            return results
        results = list(results)
        for k in self.outputs:
            results[k] = results[k].cpu()
        return tuple(results)


def on_device(call: Callable, gm: torch.fx.GraphModule, device: str) -> Callable:
    """`call` adapted to the host scalars of `gm`, compiled for `device`; `call` itself when there are none
    or the graph runs on the CPU."""
    if not device.startswith("cuda"):
        return call
    inputs, outputs = host_scalar_inputs(gm), host_scalar_outputs(gm)
    return HostScalarCall(call, device, inputs, outputs) if inputs or outputs else call
