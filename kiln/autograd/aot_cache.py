"""The compile cache of AOT autograd: a captured graph's ATen graphs, kept across processes.

A second process that captures the same program gets the same captured graph; with this cache it skips
analyzing its outputs, tracing (the joint forward+backward or the inference graph), functionalizing and
partitioning, and hands
the stored ATen graphs straight to the code generator, whose own cache (kiln/runtime/graph_cache.py) then
skips everything up to loading the kernels.

What is kept (one JSON file per variant, `aot/<key[:2]>/<key>.json`, published with a manifest like every
cache file) is plain data: each ATen graph as FX code text plus a node-by-node description that is re-parsed
without running it (kiln/runtime/fx_codec.py), and the numbers the runtime needs (which outputs are input
mutations, which inputs get a gradient, which saved values are sizes or inputs, the partition's summary).
The analysis of the captured graph's outputs (`FlatProgram.analyze`, a fake run: the output structure, aliases,
what eager saves) is kept too, as plain dataclass fields and pytree's own JSON of the output structure.

The key is a SHA-256 over everything the product depends on: the captured graph's code (which names every
call: only torch's, kiln's and Python's own module-level functions are accepted, not a user's function whose
body the code does not show), its tensor attributes that are not parameters or buffers (by value), the flat
inputs' sizes, strides, dtypes and devices, the non-tensor inputs baked in as constants, the variant (which
inputs require grad, autocast), the code generator and its options, torch's switches that change what a
trace records, and the versions of kiln, torch, Triton and Python (graph_cache.environment). With symbolic
sizes, the inputs' sizes are expressions over the shape environment's symbols, the key describes that
environment (ranges, guards, replacements), and the product keeps the guards the trace added, which a process
loading it adds to its own environment first (kiln/runtime/symbolic_sizes.py).
"""
from __future__ import annotations

import builtins
import dataclasses
import hashlib
import json
import logging
import operator
import os
import sys

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.fx.node import _get_qualified_name

from kiln.autograd.functionalize import InputMutation
from kiln.autograd.partition import Partition
from kiln.autograd.saved_versions import SavedByEager
from kiln.autograd.signature import (
    AliasOutput,
    ConstantOutput,
    FlatProgram,
    GraphOutput,
    IntSpec,
    OutputAlias,
    OutputSignature,
    TensorSpec,
)
from kiln.autograd.view_replay import ViewStep
from kiln.runtime import fx_codec, graph_cache, symbolic_sizes
from kiln.runtime.graph_cache import Uncacheable, decode_value, encode_value

log = logging.getLogger("kiln.aot")

FOLDER = "aot"
stats = graph_cache.folder_stats[FOLDER]
_PARTITION_NUMBERS = ("strategy", "saved", "saved_is_size", "saved_bytes", "naive_saved", "naive_bytes",
                      "saved_inputs", "saved_input_bytes", "recomputed", "saved_outputs")
# Modules whose module-level functions may be called by a cached captured graph: their behaviour is fixed by
# the versions in the key (a user's function is not: its code is not in the captured graph's code).
_KNOWN_MODULES = ("torch", "kiln", "operator", "_operator", "math", "builtins")


# ----------------------------------------------------------------------------- the key


def variant_key(program: FlatProgram, variant: tuple, compiler: str) -> str:
    """The product key of `program`'s `variant` (AOTCompiled.key) compiled by `compiler` (its identity and
    options); Uncacheable if it has none."""
    gm = program.gm
    state = set(program.state_names)
    constants = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            raise Uncacheable("a call_module node")
        if node.op == "call_function":
            _check_known(node.target)
        if node.op == "get_attr" and node.target not in state:
            constants[node.target] = encode_value(operator.attrgetter(node.target)(gm))
    inputs = [_describe_spec(spec) for spec in program.input_specs]
    baked = {str(i): _plain(value) for i, value in program.constants.items()}
    requires_grad, autocast, cast_cache = variant
    described = {"code": gm.code, "constants": constants, "inputs": inputs, "baked": baked,
                 "num_args": program.num_args, "state": program.state_names, "parameters": program.parameters,
                 "requires_grad": requires_grad, "autocast": [[d, str(t)] for d, t in autocast],
                 "cast_cache": None if cast_cache is None else [cast_cache.enabled, cast_cache.held],
                 "compiler": compiler, "switches": switches(), "environment": graph_cache.environment(),
                 "shape_env": symbolic_sizes.describe_env(program.shape_env())}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def _describe_spec(spec) -> list:
    """A flat input's metadata, a symbolic size as its expression (an int input made a symbol: its symbol)."""
    if isinstance(spec, IntSpec):
        return ["symint", str(spec.value.node.expr)]
    size = graph_cache.size_text
    return [[size(s) for s in spec.shape], [size(s) for s in spec.stride], str(spec.dtype), str(spec.device)]


def switches() -> dict:
    """torch's global settings that change what a trace records (which attention kernel, default dtype,
    deterministic algorithms) and kiln's environment switches the code generator reads."""
    backends = torch.backends
    return {"default_dtype": str(torch.get_default_dtype()),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "sdp": [backends.cuda.flash_sdp_enabled(), backends.cuda.mem_efficient_sdp_enabled(),
                    backends.cuda.math_sdp_enabled(), backends.cuda.cudnn_sdp_enabled()],
            "mkldnn": backends.mkldnn.enabled, "cudnn": backends.cudnn.enabled,
            "tf32": [backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32],
            "environ": {name: os.environ.get(name) for name in ("KILN_CPU_BACKEND", "TRITON_INTERPRET")}}


def _check_known(target) -> None:
    """A call the captured graph's code names completely: a torch operator, or a function of a module in
    `_KNOWN_MODULES` found again under the name the code prints for it (not a closure, not a user's function)."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return
    try:
        root, *path = _get_qualified_name(target).split(".")
    except (RuntimeError, AttributeError, TypeError):
        path, root = [], ""
    found = sys.modules.get(root) if root in _KNOWN_MODULES else None
    if not path:  # FX prints a builtin (len, getattr) by its bare name
        found = getattr(builtins, root, None)
    for part in path:
        found = getattr(found, part, None)
    if found is None or found is not target:
        raise Uncacheable(f"calls {target!r}, a function its code does not show")


def _plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return [type(value).__name__, value]
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [_plain(v) for v in value]]
    raise Uncacheable(f"an input of type {type(value).__name__}")


# ----------------------------------------------------------------------------- products


def encode_inference(signature: OutputSignature, graph: torch.fx.GraphModule, mutations: list[InputMutation]) -> dict:
    return {"format": graph_cache.FORMAT, "kind": "inference", "signature": encode_signature(signature),
            "graphs": {"inference": fx_codec.encode_graph(graph)}, "mutations": _mutations(mutations)}


def encode_training(signature: OutputSignature, split: Partition, mutations: list[InputMutation], num_outputs: int,
                    grad_mask: list[bool]) -> dict:
    return {"format": graph_cache.FORMAT, "kind": "training", "signature": encode_signature(signature),
            "graphs": {"forward": fx_codec.encode_graph(split.forward),
                       "backward": fx_codec.encode_graph(split.backward)},
            "mutations": _mutations(mutations), "num_outputs": num_outputs, "grad_mask": list(grad_mask),
            "partition": {name: getattr(split, name) for name in _PARTITION_NUMBERS}}


def _mutations(mutations: list[InputMutation]) -> list[list[int]]:
    return [[m.input_index, m.output_index] for m in mutations]


def decode_graphs(product: dict, kind: str, mode) -> tuple[OutputSignature, dict[str, torch.fx.GraphModule],
                                                               list[InputMutation]]:
    """The product's output signature, ATen graphs (their node values fakes of `mode`) and input mutations;
    ValueError (or a KeyError, TypeError) if it is not a `kind` product that rebuilds."""
    if product.get("kind") != kind:
        raise ValueError(f"a {product.get('kind')} product for a {kind} variant")
    symbolic_sizes.replay_guards(mode.shape_env, product.get("shape_guards", []))
    with symbolic_sizes.no_new_guards(mode.shape_env):
        signature = decode_signature(product["signature"], mode.shape_env)
        graphs = {name: fx_codec.decode_graph(described, mode) for name, described in product["graphs"].items()}
    mutations = [InputMutation(int(i), int(o)) for i, o in product["mutations"]]
    return signature, graphs, mutations


def decode_partition(product: dict, graphs: dict) -> Partition:
    numbers = product["partition"]
    return Partition(forward=graphs["forward"], backward=graphs["backward"],
                     **{name: numbers[name] for name in _PARTITION_NUMBERS})


# ----------------------------------------------------------------------------- the output signature

# What `FlatProgram.analyze` found (signature.py), kept so that a warm compile does not run the captured graph on
# fake tensors again. Its pieces are frozen dataclasses of a few known classes over ints, bools, dtypes and tuples;
# anything else (a dynamic graph's size functions, an output constant of another type) is Uncacheable.
_SIGNATURE_CLASSES = {cls.__name__: cls for cls in (GraphOutput, AliasOutput, OutputAlias, ConstantOutput,
                                                    TensorSpec, SavedByEager, ViewStep)}
_PLAIN = (type(None), bool, int, float, str)


def encode_signature(signature: OutputSignature) -> dict:
    try:
        tree = pytree.treespec_dumps(signature.tree)
    except Exception as e:  # noqa: BLE001 -- an output container pytree cannot write as JSON (a user's class)
        raise Uncacheable(f"an output structure pytree cannot describe ({type(e).__name__})") from e
    if pytree.treespec_loads(tree) != signature.tree:
        raise Uncacheable("an output structure that does not read back as itself")
    fields = {f.name: _encode_part(getattr(signature, f.name)) for f in dataclasses.fields(signature)
              if f.name != "tree"}
    return {"tree": tree, **fields}


def decode_signature(described: dict, shape_env=None) -> OutputSignature:
    fields = {f.name: _decode_part(described[f.name], shape_env) for f in dataclasses.fields(OutputSignature)
              if f.name != "tree"}
    return OutputSignature(tree=pytree.treespec_loads(described["tree"]), **fields)


def _encode_part(value):
    if type(value) in _PLAIN:
        return value
    if type(value) is list:
        return [_encode_part(v) for v in value]
    if type(value) is tuple:
        return {"tuple": [_encode_part(v) for v in value]}
    if type(value) is frozenset:
        return {"frozenset": sorted(_encode_part(v) for v in value)}
    if isinstance(value, (torch.dtype, torch.device)):
        return encode_value(value)
    if symbolic_sizes.is_symbolic(value):
        return symbolic_sizes.encode_int(value)
    if _SIGNATURE_CLASSES.get(type(value).__name__) is type(value):
        return {"class": type(value).__name__,
                "fields": {f.name: _encode_part(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    raise Uncacheable(f"an output signature holding a {type(value).__name__}")


def _decode_part(value, shape_env):
    if isinstance(value, list):
        return [_decode_part(v, shape_env) for v in value]
    if not isinstance(value, dict):
        return value
    if "tuple" in value:
        return tuple(_decode_part(v, shape_env) for v in value["tuple"])
    if "frozenset" in value:
        return frozenset(_decode_part(v, shape_env) for v in value["frozenset"])
    if "class" in value:
        cls = _SIGNATURE_CLASSES[value["class"]]
        return cls(**{k: _decode_part(v, shape_env) for k, v in value["fields"].items()})
    if "symint" in value:
        return symbolic_sizes.decode_int(value, shape_env)
    return decode_value(value)


__all__ = ["variant_key", "switches", "encode_inference", "encode_training", "decode_graphs", "decode_partition",
           "encode_signature", "decode_signature", "stats", "FOLDER"]
