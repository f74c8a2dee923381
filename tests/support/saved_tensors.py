"""What a training graph's forward saves for its backward, under kiln and under torch.compile's partitioner.

kiln: the `Partition` its autograd stage chose (`kiln.compile` with kiln's inductor; the graphs are built and
run). torch.compile: Inductor's own partitioner (`min_cut_rematerialization_partition` with compiler="inductor")
over Inductor's decompositions, through `aot_autograd` with compilers that run the ATen graphs as they are, so no
kernel is generated; Inductor's joint-graph pattern passes are left out (they need its compile context). Both
count the bytes of the saved tensors that are not parameters (each compiler holds those anyway, and saves them
for free).
"""
from __future__ import annotations

import dataclasses
import functools

import torch

import kiln
from kiln.pipeline import inductor


@dataclasses.dataclass
class Saved:
    """The saved tensors of one training graph that are not parameters: (dtype, shape) each, and their bytes."""

    tensors: list[tuple[torch.dtype, tuple[int, ...]]]

    @property
    def bytes(self) -> int:
        return sum(dtype.itemsize * _numel(shape) for dtype, shape in self.tensors)

    def count(self, dtype: torch.dtype, shape: tuple[int, ...]) -> int:
        return sum(1 for t in self.tensors if t == (dtype, tuple(shape)))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def kiln_saved(model: torch.nn.Module, inputs: list, autocast: torch.dtype | None = None) -> tuple[Saved, list]:
    """(What kiln's forward saves for `model(*inputs)`'s backward, the partition) after one step compiled by
    kiln (the loss backpropagated, parameters' grads set)."""
    built, parameters = [], []

    def backend(gm, example_inputs):
        parameters.append({i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)})
        built.append(inductor(gm, example_inputs))
        return built[-1]

    _step(kiln.compile(model, backend=backend, fullgraph=True), inputs, autocast)
    (split,) = [p for compiled in built for p in compiled.partitions.values()]
    (params,) = parameters
    outputs = split.forward.graph.find_nodes(op="output")[0].args[0]
    saved = outputs[len(outputs) - len(split.saved):]
    tensors = [(n.meta["val"].dtype, tuple(n.meta["val"].shape)) for n, i, size in
               zip(saved, split.saved_inputs, split.saved_is_size) if not size and i not in params]
    return Saved(tensors), split


def torch_saved(model: torch.nn.Module, inputs: list, autocast: torch.dtype | None = None) -> Saved:
    """What torch.compile's partitioner saves for `model(*inputs)`'s backward (see the module docstring)."""
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    backwards, parameters = [], []

    def forward(gm, example_inputs):
        return make_boxed_func(gm.forward)

    def backward(gm, example_inputs):
        backwards.append(gm)
        return make_boxed_func(gm.forward)

    inductor_partition = functools.partial(min_cut_rematerialization_partition, compiler="inductor")
    compile_with_partition = aot_autograd(fw_compiler=forward, bw_compiler=backward, partition_fn=inductor_partition,
                                          decompositions=select_decomp_table(), keep_inference_input_mutations=True)

    def backend(gm, example_inputs):
        parameters.append({i for i, t in enumerate(example_inputs) if isinstance(t, torch.nn.Parameter)})
        return compile_with_partition(gm, example_inputs)

    torch._dynamo.reset()
    _step(torch.compile(model, backend=backend, fullgraph=True), inputs, autocast)
    (graph,) = backwards
    (params,) = parameters
    tensors = []
    for node in graph.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if node.name.startswith("tangents") or not isinstance(val, torch.Tensor):
            continue
        if node.name.startswith("primals_") and int(node.name.split("_")[1]) - 1 in params:
            continue
        tensors.append((val.dtype, tuple(val.shape)))
    return Saved(tensors)


def _step(fn, inputs: list, autocast: torch.dtype | None):
    with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
        loss = fn(*inputs)
    loss.backward()
    return loss
