"""The cuDNN convolutions a lowered graph's wrapper will call, as calls the compile can make ahead of it.

kiln/runtime/cudnn_warmup.py makes them once during the compile, so that cuDNN chooses each one's algorithm
while the kernels build rather than in the first step. Each is described with exactly what the wrapper passes:
the buffers' (or views') sizes, strides, storage offsets and dtypes, and the other arguments as they are. A
call with a symbolic size or stride is left out (its sizes are known only at run time).
"""
from __future__ import annotations

import torch

from kiln.lower import ir
from kiln.runtime.cudnn_warmup import Call, ScratchTensor

aten = torch.ops.aten

CUDNN_OPS = (aten.convolution.default, aten.convolution_backward.default)


def convolution_calls(graph: ir.LoweredGraph) -> list[Call]:
    """The graph's convolution and convolution-backward externs whose arguments are all known (static sizes)."""
    layouts = None
    calls = []
    for node in graph.nodes:
        if not (isinstance(node, ir.Extern) and node.op in CUDNN_OPS) or node.kwargs:
            continue
        layouts = layouts if layouts is not None else graph.buffer_layouts()
        try:
            args = tuple(_argument(a, layouts) for a in node.args)
        except _Symbolic:
            continue
        calls.append(Call(node.op, args))
    return calls


class _Symbolic(Exception):
    """An argument known only at run time."""


def _argument(a, layouts: dict):
    if isinstance(a, ir.TensorRef):
        layout = a.layout if a.view else layouts.get(a.buf, a.layout)
        return ScratchTensor(_ints(layout.size), _ints(layout.stride), _int(layout.offset), layout.dtype)
    if isinstance(a, (list, tuple)):
        return tuple(_argument(x, layouts) for x in a)
    if isinstance(a, ir.SymRef) and getattr(a.expr, "is_Integer", False):
        return int(a.expr)
    if a is None or isinstance(a, (bool, int, float)):
        return a
    raise _Symbolic  # a size known only at run time (or a value no convolution takes)


def _ints(values) -> tuple[int, ...]:
    return tuple(_int(v) for v in values)


def _int(value) -> int:
    if isinstance(value, int):
        return value
    if getattr(value, "is_Integer", False):
        return int(value)
    raise _Symbolic
