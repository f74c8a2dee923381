"""0-d CPU tensors in a CUDA graph: read where eager reads them.

Eager lets a 0-d CPU tensor mix into CUDA ops (a scale `torch.tensor(d) ** 0.5` made without a device, as
DeBERTa's attention does): ATen reads it as a number. Triton kernels read device memory only, so a kernel that
reads such a value reads a copy of it on the GPU, made in the graph (kiln/lower/host_work.py: a copy of 0-d
pageable memory, staged without waiting for the GPU); the ops eager runs on the CPU, and the ATen calls that
take such a value, read it where it is, as eager's do, and a 0-d CPU value the graph returns is one an ATen
call made on the host (or an input). This beats running the whole graph through ATen, which is what a graph
mixing devices did.
"""
from __future__ import annotations

import torch


def is_host_scalar(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0
