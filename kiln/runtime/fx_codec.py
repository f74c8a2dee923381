"""An ATen-level FX graph as plain data (JSON), and back: how the compile cache keeps AOT autograd's graphs.

    described = encode_graph(gm)                 # {"code": gm.code, "nodes": [...], "constants": {...}}
    gm = decode_graph(described, fake_mode)      # the same graph, every node's meta["val"] a fake tensor again

Nothing is pickled and nothing read back is executed: each node is data (its op, its target named as a torch
operator, `operator.<name>`, its arguments with node references by name, the metadata of its value), and a
target is looked up only among torch's registered operators and a table of Python's `operator` functions and torch's
functions of symbolic sizes (graph_cache.SIZE_FUNCTIONS). The graph's Python code
(`gm.code`) is kept beside the nodes, for a reader and as a check: the rebuilt graph must print exactly the same
code, or it is refused (`ValueError`). The rebuilt module does not compile that code until it is called
(kiln/runtime/lazy_graphs.py): the code generator reads its nodes, and its cache key the code printed here.

Only what the code generator needs of a node's metadata is kept: `val` (the tensor metadata it lowers from) and
`stack_trace` (FX prints it into the code). A symbolic size is kept as its expression over the shape
environment's symbols and made again in the environment of the fake mode it is decoded with
(kiln/runtime/symbolic_sizes.py). Targets of another kind (a higher-order operator, a Python function) raise
`Uncacheable`.
"""
from __future__ import annotations

import functools
import operator

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from kiln.runtime import lazy_graphs, symbolic_sizes
from kiln.runtime.graph_cache import SIZE_FUNCTIONS, Uncacheable, decode_value, encode_value, function_name

_NODE_OPS = ("placeholder", "call_function", "get_attr", "output")
_KEPT_META = ("stack_trace",)


# ----------------------------------------------------------------------------- targets


def _encode_target(node: torch.fx.Node):
    target = node.target
    if node.op in ("placeholder", "get_attr", "output"):
        return target
    if isinstance(target, torch._ops.OpOverload):
        return {"op": target.name(), "overload": target._overloadname}
    named = function_name(target)
    if named is not None:
        return {named[0]: named[1]}
    raise Uncacheable(f"a call of {target!r}, not a torch operator")


def _decode_target(op: str, target):
    if op != "call_function":
        if not isinstance(target, str):
            raise ValueError(f"a {op} node's target is not a name")
        return target
    if isinstance(target, dict) and len(target) == 1:
        [(module, name)] = target.items()
        found = SIZE_FUNCTIONS.get((module, name))
        if found is None:
            raise ValueError(f"no function {module}.{name} a graph may call")
        return found
    if isinstance(target, dict) and "op" in target:
        return decode_value(target)
    raise ValueError("a call_function node names no operator")


# ----------------------------------------------------------------------------- arguments

# JSON has lists, numbers, strings, true/false/null; everything else a node's argument can be is a one-key
# object: {"node": name}, {"tuple": [...]}, {"dict": [[k, v], ...]}, {"slice": [...]}, or a value
# `encode_value` describes (a dtype, a device, a memory format, a layout).


def _encode_arg(value):
    if isinstance(value, torch.fx.Node):
        return {"node": value.name}
    if isinstance(value, tuple):
        return {"tuple": [_encode_arg(v) for v in value]}
    if isinstance(value, list):
        return [_encode_arg(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[k, _encode_arg(v)] for k, v in value.items()]}
    if isinstance(value, slice):
        return {"slice": [_encode_arg(value.start), _encode_arg(value.stop), _encode_arg(value.step)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        raise Uncacheable("a tensor as a node's argument")
    if symbolic_sizes.is_symbolic(value):
        return symbolic_sizes.encode_int(value)
    return encode_value(value)


def _decode_arg(value, nodes: dict, shape_env):
    if isinstance(value, list):
        return [_decode_arg(v, nodes, shape_env) for v in value]
    if not isinstance(value, dict):
        return value
    if "node" in value:
        return nodes[value["node"]]
    if "tuple" in value:
        return tuple(_decode_arg(v, nodes, shape_env) for v in value["tuple"])
    if "dict" in value:
        return {k: _decode_arg(v, nodes, shape_env) for k, v in value["dict"]}
    if "slice" in value:
        return slice(*(_decode_arg(v, nodes, shape_env) for v in value["slice"]))
    if "symint" in value:
        return symbolic_sizes.decode_int(value, shape_env)
    if "tensor" in value:
        raise ValueError("a tensor as a node's argument")
    return decode_value(value)


# ----------------------------------------------------------------------------- node values (meta["val"])


def _encode_val(value):
    if isinstance(value, torch.Tensor):
        size = symbolic_sizes.encode_int
        return {"fake": [[size(s) for s in value.shape], [size(s) for s in value.stride()],
                         size(value.storage_offset()), str(value.dtype).removeprefix("torch."), str(value.device),
                         value.requires_grad]}
    if isinstance(value, (list, tuple)):
        return {"tuple" if isinstance(value, tuple) else "list": [_encode_val(v) for v in value]}
    if symbolic_sizes.is_symbolic(value):
        return {"value": symbolic_sizes.encode_int(value)}
    if value is None or isinstance(value, (bool, int, float)):
        return {"value": value}
    raise Uncacheable(f"a node value of type {type(value).__name__}")


def _decode_val(value: dict, mode: FakeTensorMode):
    if "fake" in value:
        shape, stride, offset, dtype, device, requires_grad = value["fake"]
        dtype = getattr(torch, dtype)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"not a dtype: {value['fake'][3]}")
        size = functools.partial(symbolic_sizes.decode_int, shape_env=mode.shape_env)
        return _fake(mode, [size(s) for s in shape], [size(s) for s in stride], size(offset), dtype,
                     torch.device(device), requires_grad)
    if "tuple" in value:
        return tuple(_decode_val(v, mode) for v in value["tuple"])
    if "list" in value:
        return [_decode_val(v, mode) for v in value["list"]]
    return symbolic_sizes.decode_int(value["value"], mode.shape_env)


def _fake(mode: FakeTensorMode, shape: list, stride: list, offset: int, dtype: torch.dtype, device: torch.device,
          requires_grad: bool) -> FakeTensor:
    """A fake tensor of `mode` with this geometry: a meta tensor wrapped as the fake mode wraps its own (a graph
    holds thousands of node values; making each through the mode's dispatch costs several times more)."""
    if isinstance(offset, int) and offset == 0:
        meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    else:
        meta = torch.empty(offset + _extent(shape, stride), dtype=dtype, device="meta").as_strided(shape, stride,
                                                                                                   offset)
    fake = FakeTensor(mode, meta, device)
    return fake.requires_grad_(True) if requires_grad else fake


def _extent(shape: list, stride: list) -> int:
    """Elements spanned by a view of `shape` and `stride` from its first element (at least that many, with
    symbolic sizes: comparing one to 0 would add a guard)."""
    if any(type(s) is int and s == 0 for s in shape):
        return 0
    return 1 + sum((size - 1) * st for size, st in zip(shape, stride))


# ----------------------------------------------------------------------------- graphs


def encode_graph(gm: torch.fx.GraphModule) -> dict:
    """`gm` as JSON-ready data (see the module docstring); Uncacheable if a node cannot be described."""
    nodes = []
    for node in gm.graph.nodes:
        if node.op not in _NODE_OPS:
            raise Uncacheable(f"a {node.op} node")
        entry = {"name": node.name, "op": node.op, "target": _encode_target(node),
                 "args": _encode_arg(node.args), "kwargs": {k: _encode_arg(v) for k, v in node.kwargs.items()}}
        if "val" in node.meta:
            entry["val"] = _encode_val(node.meta["val"])
        entry.update({k: node.meta[k] for k in _KEPT_META if isinstance(node.meta.get(k), str)})
        nodes.append(entry)
    constants = {n.target: encode_value(operator.attrgetter(n.target)(gm)) for n in gm.graph.find_nodes(op="get_attr")}
    return {"code": gm.code, "nodes": nodes, "constants": constants}


def decode_graph(described: dict, mode: FakeTensorMode) -> torch.fx.GraphModule:
    """The graph `encode_graph` described, its node values fake tensors of `mode`; ValueError if the description
    does not rebuild the code it was stored with."""
    graph = torch.fx.Graph()
    nodes: dict[str, torch.fx.Node] = {}
    for entry in described["nodes"]:
        op = entry["op"]
        if op not in _NODE_OPS:
            raise ValueError(f"a node of kind {op!r}")
        args = _decode_arg(entry["args"], nodes, mode.shape_env)
        kwargs = {k: _decode_arg(v, nodes, mode.shape_env) for k, v in entry["kwargs"].items()}
        node = graph.create_node(op, _decode_target(op, entry["target"]), tuple(args), kwargs, name=entry["name"])
        if node.name != entry["name"]:
            raise ValueError(f"node {entry['name']!r} could not keep its name")
        if "val" in entry:
            node.meta["val"] = _decode_val(entry["val"], mode)
        node.meta.update({k: entry[k] for k in _KEPT_META if isinstance(entry.get(k), str)})
        nodes[node.name] = node
    root = torch.nn.Module()
    for name, value in described["constants"].items():
        if not name.isidentifier():
            raise ValueError(f"a constant named {name!r}")
        setattr(root, name, decode_value(value))
    gm, code = lazy_graphs.printed_graph_module(root, graph)
    if code != described["code"]:
        raise ValueError("the rebuilt graph's code differs from the code stored with it")
    return gm


__all__ = ["encode_graph", "decode_graph"]
