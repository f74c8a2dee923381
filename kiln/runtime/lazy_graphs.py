"""FX graph modules whose Python code is generated on first use, not when they are built.

`torch.fx.GraphModule` generates and compiles its graph's Python code as it is built (and on every
`recompile()`): for a graph of thousands of ATen ops, about as long as tracing a tenth of it. The
autograd stage builds several graph modules per compile (the traced joint, its functional copy, the
forward and the backward) that nothing runs as Python: the partitioner reads the joint's nodes and the
code generator the forward's and backward's. Built with `graph_module` (or traced within
`lazily_built()`), a graph module generates its code only when it is called or its `code` is read
(`torch.fx._lazy_graph_module`, which Inductor uses for the same reason); `source` gives the code for
a cache key without compiling it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch.fx as fx
from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module


def graph_module(root, graph: fx.Graph, class_name: str = "GraphModule") -> fx.GraphModule:
    """`fx.GraphModule(root, graph)`, its code generated on first use."""
    return _LazyGraphModule(root, graph, class_name)


@contextlib.contextmanager
def lazily_built() -> Iterator[None]:
    """Graph modules that torch builds within (`make_fx`'s) generate their code on first use."""
    with _use_lazy_graph_module(True):
        yield


def source(gm: fx.GraphModule) -> str:
    """`gm.code`, generated here without compiling it if `gm` has not generated it yet."""
    if isinstance(gm, _LazyGraphModule) and gm._needs_recompile():
        return gm.graph.python_code(root_module="self").src
    return gm.code
