"""Which code generator compiles a graph: C++/OpenMP for CPU tensors, Triton for CUDA tensors.

Like torch's `cpu_backend` / `cuda_backend`: CUDA graphs always get Triton;
CPU graphs get C++ unless the `cpu_backend` option (or `KILN_CPU_BACKEND`) says
"triton", which runs Triton kernels on CPU tensors through Triton's interpreter
(`TRITON_INTERPRET=1`) — how the Triton target is tested without a GPU.
A target is a module with `generate_module(sched)`, `load_kernels(source,
kernels)` and `ARTEFACT` (the file name its kernel source is kept under).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from types import ModuleType

import torch

from kiln.codegen import cpp
from kiln.codegen import triton as triton_target


@dataclass(frozen=True)
class Target:
    name: str          # "cpp" | "triton"
    device: str        # where the wrapper allocates kernel outputs
    module: ModuleType
    artefact: str      # "kernels.cpp" | "kernels.py"


def graph_device(gm: torch.fx.GraphModule, example_inputs) -> torch.device:
    """The device of the graph's tensors (CUDA if any tensor is on CUDA, else CPU)."""
    devices = [t.device for t in example_inputs if isinstance(t, torch.Tensor)]
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            devices.append(v.device)
    for d in devices:
        if d.type == "cuda":
            return d
    return torch.device("cpu")


def select_target(gm: torch.fx.GraphModule, example_inputs, options: dict) -> Target:
    device = graph_device(gm, example_inputs)
    cpu_backend = options.get("cpu_backend") or os.environ.get("KILN_CPU_BACKEND") or "cpp"
    if device.type == "cuda" or cpu_backend == "triton":
        if device.type != "cuda" and not triton_target.interpreting():
            raise RuntimeError("cpu_backend='triton' runs Triton kernels on CPU tensors: set TRITON_INTERPRET=1")
        dev = f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}" \
            if device.type == "cuda" else "cpu"
        return Target("triton", dev, triton_target, "kernels.py")
    return Target("cpp", "cpu", cpp, "kernels.cpp")
