"""A CUDA graph's call runs with the graph's device current.

Triton launches a kernel through the current device's context, and kernels are loaded into the context of
the device their graph was compiled for. A caller whose current device is another one (a model on `cuda:1`
in a process that never called `torch.cuda.set_device`) would launch across contexts and fail with
"invalid resource handle". The check per call is one C call; the switch happens only when it differs.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch


def made_current(device: str):
    """A context with `device` the current CUDA device; nothing for the CPU or where no GPU is present."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return contextlib.nullcontext()
    return torch.cuda.device(torch.device(device))


def with_current_device(call: Callable, device: str) -> Callable:
    """`call` (boxed: one list of inputs), made to run with `device` current; `call` itself for the CPU (and
    for CUDA-named graphs that never run on a GPU: kernels for a GPU compiled on a machine without one)."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return call
    index = torch.device(device).index
    current = torch._C._cuda_getDevice

    def run(args: list):
        if current() == index:
            return call(args)
        with torch.cuda.device(index):
            return call(args)

    return run
