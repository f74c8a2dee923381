"""FX graph modules whose Python code is generated on first use, not when they are built.

`torch.fx.GraphModule` generates and compiles its graph's Python code as it is built (and on every
`recompile()`): for a graph of thousands of ATen ops, about as long as tracing a tenth of it. The
autograd stage builds several graph modules per compile (the traced joint, its functional copy, the
forward and the backward) that nothing runs as Python: the partitioner reads the joint's nodes and the
code generator the forward's and backward's. Built with `graph_module` (or traced within
`lazily_built()`), a graph module generates its code only when it is called or its `code` is read
(`torch.fx._lazy_graph_module`, which Inductor uses for the same reason); `source` gives the code for
a cache key without compiling it. A graph rebuilt from the compile cache is printed once, to check it against
the code stored with it (`printed_graph_module`), and `source` returns that printing until the module is next
recompiled, as `gm.code` of an eager graph module is the code of its last recompile.
"""
from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator

import torch.fx as fx
from torch.fx._lazy_graph_module import _LazyGraphModule, _use_lazy_graph_module


def graph_module(root, graph: fx.Graph, class_name: str = "GraphModule") -> fx.GraphModule:
    """`fx.GraphModule(root, graph)`, its code generated on first use."""
    return _LazyGraphModule(root, graph, class_name)


class _PrintedGraphModule(_LazyGraphModule):
    """A lazily built graph module that keeps the code it printed (`_printed_code`) until its next recompile()."""

    def recompile(self) -> None:
        self.__dict__.pop("_printed_code", None)
        super().recompile()


def printed_graph_module(root, graph: fx.Graph) -> tuple[fx.GraphModule, str]:
    """(`graph_module(root, graph)`, its code): the code printed now and kept for `source`, not compiled; the
    module compiles it when first called. A graph read back from the cache is printed to be checked, and its cache
    key reads the same printing: a second printing would cost as much as the first."""
    gm = _PrintedGraphModule(root, graph)
    code = gm._printed_code = graph.python_code(root_module="self").src
    return gm, code


@contextlib.contextmanager
def lazily_built() -> Iterator[None]:
    """Graph modules that torch builds within (`make_fx`'s) generate their code on first use."""
    with _use_lazy_graph_module(True):
        yield


def source(gm: fx.GraphModule) -> str:
    """`gm.code`, generated here without compiling it if `gm` has not generated it yet."""
    if isinstance(gm, _LazyGraphModule) and gm._needs_recompile():
        printed = gm.__dict__.get("_printed_code")
        return printed if printed is not None else gm.graph.python_code(root_module="self").src
    return gm.code


def copied_constant(graph: fx.Graph, traced: fx.GraphModule, node: fx.Node, constants: dict, name: str) -> fx.Node:
    """A `get_attr` in `graph` of the constant `node` (a `get_attr` of `traced`, a graph traced apart) reads, kept in
    `constants` as `name` for `module_with_constants`."""
    constants[name] = operator.attrgetter(node.target)(traced)
    copied = graph.get_attr(name)
    copied.meta.update(node.meta)
    return copied


def module_with_constants(owner: fx.GraphModule, graph: fx.Graph, constants: dict) -> fx.GraphModule:
    """`graph_module` of `graph`, a graph made from `owner`'s nodes and others traced apart: each attribute
    its nodes read is `constants`'s of that name, else `owner`'s (a qualified name, as FX writes it); the meta
    is `owner`'s."""
    owned = {n.target: operator.attrgetter(n.target)(owner) for n in graph.nodes
             if n.op in ("get_attr", "call_module") and n.target not in constants}
    gm = graph_module({**owned, **constants}, graph)
    gm.meta.update(owner.meta)
    return gm
