"""Which code generator compiles a graph: C++/OpenMP for CPU tensors, Triton for CUDA tensors.

Like torch's `cpu_backend` / `cuda_backend`: CUDA graphs always get Triton;
CPU graphs get C++ unless the `cpu_backend` option (else `KILN_CPU_BACKEND`)
says "triton", which runs Triton kernels on CPU tensors through Triton's
interpreter (`TRITON_INTERPRET=1`) — how the Triton target is tested without a
GPU. A target is a module with `generate_module(sched)`, `load_kernels(source,
kernels)` and, if it rewrites the lowered graph before scheduling (Triton's
matmul templates and shape padding), `prepare(graph, device, ...)`.
`select_target` binds the options a target reads into its `Target`, so the
pipeline hands each target function only the graph, schedule or source.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kiln.codegen import cpp
from kiln.codegen import triton as triton_target


@dataclass(frozen=True)
class Target:
    name: str          # "cpp" | "triton"
    device: str        # where the wrapper allocates kernel outputs
    artefact: str      # "kernels.cpp" | "kernels.py": the file name its kernel source is kept under
    prepare: Callable  # (LoweredGraph) -> template specs; rewrites the graph's externs before scheduling
    generate: Callable  # (Schedule) -> (source, kernel name -> kernel)
    load: Callable     # (source, kernels) -> kernel name -> launcher


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


def _no_templates(graph) -> dict:
    """The C++ target rewrites nothing before scheduling and has no templates."""
    return {}


def select_target(gm: torch.fx.GraphModule, example_inputs, cpu_backend: str | None = None,
                  max_autotune: bool = False, shape_padding: bool = False) -> Target:
    """The target for `gm`'s device, with the options it reads bound (`max_autotune` and `shape_padding` are
    read by Triton only)."""
    device = graph_device(gm, example_inputs)
    cpu_backend = cpu_backend or os.environ.get("KILN_CPU_BACKEND") or "cpp"
    if device.type == "cuda" or cpu_backend == "triton":
        if device.type != "cuda" and not triton_target.interpreting():
            raise RuntimeError("cpu_backend='triton' runs Triton kernels on CPU tensors: set TRITON_INTERPRET=1")
        dev = f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}" \
            if device.type == "cuda" else "cpu"
        prepare = functools.partial(triton_target.prepare, device=dev, max_autotune=max_autotune,
                                    shape_padding=shape_padding)
        generate = functools.partial(triton_target.generate_module, max_autotune=max_autotune)
        return Target("triton", dev, "kernels.py", prepare, generate,
                      functools.partial(triton_target.load_kernels, device=dev))
    return Target("cpp", "cpu", "kernels.cpp", _no_templates, cpp.generate_module, cpp.load_kernels)
