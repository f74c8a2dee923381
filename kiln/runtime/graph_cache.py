"""The compile cache of whole ATen graphs: what the code generator made of a graph, kept across processes.

A second process that captures the same program hands the same ATen graphs to the code generator;
with this cache it skips decomposing, lowering, scheduling, memory planning and generating, and
goes straight to loading the kernels (themselves cached by kiln/runtime/cache.py) and running the
wrapper.

What is kept (the *product*, one JSON file per graph, `graphs/<key[:2]>/<key>.json`) is text and
plain data only: the kernels' source (C++ or Triton), the wrapper's Python source, each kernel's argument
list (and a Triton kernel's launchers with the argument dtypes they are compiled for), and the wrapper's
namespace as descriptions (devices, ATen operators by name, tensor constants by value). Autotuning
decisions are kept beside it by kiln/runtime/autotune.py, and read back when a tuned launcher first runs.
No pickle, no code object: what is executed is source kiln regenerates the namespace for, and only
after the file matched the manifest written with it (kiln/runtime/private_files.py).

The key is a SHA-256 over everything the product depends on: the graph's code (FX prints it as
Python), the metadata of its inputs (sizes, strides, dtype, device, requires_grad), the values of
its tensor constants, its kind (inference, forward, backward), the compile options, and the
versions of what generates and builds it (a hash of kiln's own source, torch, Triton, Python, the
C++ compiler and its flags, the CPU). A graph with symbolic sizes also keys on what the code generator reads
of their environment (ranges, guards), and keeps the guards its compile added (kiln/runtime/symbolic_sizes.py).
A graph calling an operator that is not a named torch operator is not cached: its product could depend on more
than the key says.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import json
import logging
import operator
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.fx

from kiln.config import compiler
from kiln.runtime import cache, triton_binaries
from kiln.runtime.lazy_graphs import source
from kiln.runtime.private_files import discard

log = logging.getLogger("kiln.runtime.cache")

FORMAT = 1  # the product's layout; a change makes every older product a miss
MAX_CONSTANT_BYTES = 1 << 20  # constants are stored in the product: a graph holding bigger ones is not cached

class Uncacheable(Exception):
    """The graph or its generated code holds something the product cannot describe."""


@dataclass
class KernelSignature:
    """What loading a kernel needs of its generator's kernel object: its pointer arguments, its size
    arguments, whether it returns an error code (C++), and the launchers its `precompile` compiles with which
    argument dtypes and integers (Triton: `precompiles`, recorded by `record_precompiles`), and where Triton's
    cache kept their binaries (`binaries`)."""

    arg_names: list
    size_args: list
    reports_errors: bool
    precompiles: list | None = None
    binaries: list | None = None  # Triton's cache entries its launchers loaded (`record_binaries`)
    stored: list | None = None  # per precompile, its binary kept in kiln's cache (kiln/runtime/triton_binaries.py)

    def precompile(self, module) -> None:
        """Compile the kernel's launchers as the generator's kernel object did (Triton's load_kernels)."""
        for launcher, dtypes, ints in self.precompiles or ():
            getattr(module, launcher).precompile([_dtype(d) for d in dtypes], list(ints))

    def keep_binaries(self, module) -> None:
        """After `precompile` (kiln's copies of the binaries did not load, `load_stored`): keep what the JIT
        loaded in kiln's cache again, so that a damaged or removed copy heals for the next process."""
        if self.stored:
            _store_binaries(vars(module), self.precompiles or ())

    def load_stored(self, module) -> bool:
        """Hand each launcher the binary its precompile loaded in the process that stored this product, from
        kiln's cache and without Triton's JIT; False if one is not there or not usable here (then `precompile`
        loads them through the JIT)."""
        if not self.precompiles or not self.stored or len(self.stored) != len(self.precompiles):
            return False
        for (launcher, dtypes, ints), described in zip(self.precompiles, self.stored):
            binary = triton_binaries.load(described)
            if binary is None or not getattr(module, launcher).adopt([_dtype(d) for d in dtypes], list(ints),
                                                                     binary):
                return False
        return True


class _PrecompileRecorder:
    """Stands in for a Triton kernel module: records each launcher's `precompile(dtypes, ints)` call."""

    def __init__(self):
        self.calls: list = []

    def __getattr__(self, launcher: str):
        recorder = self

        class Launcher:
            @staticmethod
            def precompile(dtypes, ints) -> None:
                if not all(isinstance(d, torch.dtype) for d in dtypes) or not all(type(i) is int for i in ints):
                    raise Uncacheable(f"launcher {launcher} precompiles with values that are not plain data")
                recorder.calls.append([launcher, [str(d).removeprefix("torch.") for d in dtypes], list(ints)])

        return Launcher


def record_precompiles(kernel) -> list | None:
    """The launcher calls a generated Triton kernel's `precompile(module)` makes, as plain data (None for a kernel
    that has no such method: C++)."""
    if not hasattr(kernel, "precompile"):
        return None
    recorder = _PrecompileRecorder()
    kernel.precompile(recorder)
    return recorder.calls


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"kiln: a cached kernel names no dtype: {name!r}")
    return value


# ----------------------------------------------------------------------------- the key


@functools.cache
def environment() -> dict:
    """The versions of everything that turns a graph into a product (see the module docstring)."""
    kiln_root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for name, path in _kiln_sources(kiln_root):
        h.update(name.encode() + b"\0" + path.read_bytes())
    return {"format": FORMAT, "kiln": h.hexdigest(), "torch": torch.__version__, "triton": _version("triton"),
            "python": sys.version, "compiler": [compiler(), *cache.CXX_FLAGS, *cache.LIBS], "host": host()}


def _kiln_sources(root: Path) -> list[tuple[str, Path]]:
    """kiln's source files (.py, .h) as (path relative to `root`, path), sorted. Walked with os.walk, leaving out
    the bytecode folders: a warm start pays for this walk, and pathlib's rglob lists every .pyc as well."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if d != "__pycache__"]
        prefix = Path(folder).relative_to(root).as_posix() + "/"
        found += [((prefix + f).removeprefix("./"), Path(folder, f)) for f in files
                  if f.endswith((".py", ".h")) and os.path.isfile(os.path.join(folder, f))]
    return sorted(found)


@functools.cache
def host() -> str:
    """The machine the C++ kernels are built for (-march=native): the architecture and its CPU flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        pass
    return f"{platform.machine()}-{hashlib.sha256(flags.encode()).hexdigest()[:16]}"


@functools.cache
def gpu(device: torch.device) -> str:
    """The GPU a Triton graph is generated for (block sizes and kernels follow its capability)."""
    try:
        return f"{torch.cuda.get_device_name(device)} sm_{''.join(map(str, torch.cuda.get_device_capability(device)))}"
    except (RuntimeError, AssertionError, ValueError):  # fake CUDA tensors on a machine without one
        return "no GPU"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


# Python functions an ATen graph may call besides torch's operators: Python's `operator` (getitem, and the size
# arithmetic of a graph with symbolic sizes) and torch's functions over symbolic values. Each is named by its
# module and name, and a name read back is looked up in this table only.
SIZE_FUNCTIONS = {**{("torch", f.__name__): f for f in (torch.sym_float, torch.sym_int, torch.sym_max, torch.sym_min,
                                                        torch.sym_not, torch.sym_ite)},
                  **{("operator", name): f for name, f in vars(operator).items()
                     if callable(f) and not isinstance(f, type) and not name.startswith("_")}}
_NAMES = {f: name for name, f in SIZE_FUNCTIONS.items()}


def function_name(target) -> tuple[str, str] | None:
    """(module, name) of a function of `SIZE_FUNCTIONS`, else None."""
    try:
        return _NAMES.get(target)
    except TypeError:  # an unhashable target
        return None


def graph_key(gm: torch.fx.GraphModule, example_inputs: list, kind: str, options: dict,
              input_writes: tuple = (), size_environment: dict | None = None) -> str:
    """The product key of `gm` compiled for `example_inputs` (see the module docstring); Uncacheable if it has
    none. `input_writes`: the outputs that are inputs' new values, which its kernels may write into the inputs
    (a product so compiled mutates its inputs: it serves no graph compiled without them). `size_environment`: what
    the code generator may read of the symbolic sizes' environment (kiln/runtime/symbolic_sizes.py
    `describe_env`)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload) \
                and function_name(node.target) is None:
            raise Uncacheable(f"calls {node.target!r}, not a named operator")
        if node.op in ("call_module", "call_method"):
            raise Uncacheable(f"a {node.op} node")
    constants = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        value = getattr(gm, node.target)
        if not isinstance(value, torch.Tensor):
            raise Uncacheable(f"attribute {node.target} is a {type(value).__name__}")
        constants[node.target] = encode_value(value)
    environ = {name: os.environ.get(name) for name in ("KILN_CPU_BACKEND", "TRITON_INTERPRET")}
    environ["deterministic"] = torch.are_deterministic_algorithms_enabled()
    environ["gpus"] = sorted({gpu(x.device) for x in example_inputs if isinstance(x, torch.Tensor)
                              and x.device.type == "cuda"})
    described = {"code": source(gm), "inputs": [_describe_input(x) for x in example_inputs], "constants": constants,
                 "kind": kind, "options": options, "input_writes": [list(w) for w in input_writes],
                 "environment": environment(), "environ": environ, "shape_env": size_environment or {}}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()


def _describe_input(x) -> list:
    """An input's metadata; a symbolic size as its expression over the environment's symbols (printed)."""
    if isinstance(x, torch.Tensor):
        return ["tensor", [size_text(s) for s in x.shape], [size_text(s) for s in x.stride()],
                size_text(x.storage_offset()), str(x.dtype), str(x.device), x.requires_grad]
    if isinstance(x, torch.SymInt):
        return ["symint", size_text(x)]
    if isinstance(x, (bool, int, float)) or x is None:
        return ["value", x]
    raise Uncacheable(f"an input of type {type(x).__name__}")


def size_text(s) -> int | str:
    """A size for a key: an int, or a symbolic size's expression printed."""
    if isinstance(s, torch.SymInt):
        return str(s.node.expr)
    if not isinstance(s, int):
        raise Uncacheable(f"a size of type {type(s).__name__}")
    return s


# ----------------------------------------------------------------------------- values of the wrapper's namespace

# kiln's own helper objects that a wrapper's namespace may hold beside ATen's (an extern whose op is a kiln
# callable: a shape-padded matmul), by class name. Each rebuilds from plain fields as `cls(**value.fields())`.
# Only classes registered here are rebuilt: a name read from a product is looked up, never imported.
_HELPERS: dict[str, type] = {}
_FIELD_TYPES = (type(None), bool, int, float, str)


def describable(cls: type) -> type:
    """Class decorator: `cls`'s instances may be kept in a product (`fields()` -> plain values, the keyword
    arguments that build an equal instance). Without it, a graph whose wrapper holds one is compiled in every
    process."""
    _HELPERS[cls.__qualname__] = cls
    return cls


def _encode_helper(value) -> dict:
    fields = value.fields()
    if not all(isinstance(k, str) and type(v) in _FIELD_TYPES for k, v in fields.items()):
        raise Uncacheable(f"a {type(value).__name__} with fields that are not plain values")
    return {"kiln": type(value).__qualname__, "fields": fields}


def encode_value(value) -> dict:
    """A JSON description of one namespace value, or Uncacheable."""
    if _HELPERS.get(type(value).__qualname__) is type(value):
        return _encode_helper(value)
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter) or value.is_meta:
            raise Uncacheable(f"a tensor of type {type(value).__name__}")
        if value.numel() * value.element_size() > MAX_CONSTANT_BYTES:
            raise Uncacheable("a large tensor constant")
        data = value.detach().cpu().contiguous().reshape(-1)  # 1-d: a 0-d tensor has no byte view
        raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
        return {"tensor": base64.b64encode(raw).decode(), "dtype": str(data.dtype).removeprefix("torch."),
                "size": list(value.shape), "stride": list(value.stride()), "device": str(value.device),
                "requires_grad": value.requires_grad}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch._ops.OpOverload):
        return {"op": value.name(), "overload": value._overloadname}
    for kind in (torch.dtype, torch.memory_format, torch.layout):
        if isinstance(value, kind):
            return {kind.__name__: str(value).removeprefix("torch.")}
    raise Uncacheable(f"a namespace value of type {type(value).__name__}")


def decode_value(d: dict):
    """The value `encode_value` described."""
    if "tensor" in d:
        dtype = getattr(torch, d["dtype"])
        raw = bytearray(base64.b64decode(d["tensor"]))
        flat = torch.frombuffer(raw, dtype=torch.uint8).view(dtype) if raw else torch.empty(0, dtype=dtype)
        out = torch.empty_strided(d["size"], d["stride"], dtype=dtype, device=d["device"])
        out.copy_(flat.reshape(d["size"]))
        return out.requires_grad_(d["requires_grad"])
    if "device" in d:
        return torch.device(d["device"])
    if "op" in d:
        namespace, name = d["op"].split("::")
        packet = getattr(getattr(torch.ops, namespace), name.split(".")[0])
        return getattr(packet, d["overload"] or "default")
    if "kiln" in d:
        helper = _HELPERS.get(d["kiln"])
        if helper is None:
            raise ValueError(f"kiln: a cached graph names a helper this kiln does not have: {d['kiln']!r}")
        return helper(**d["fields"])
    for kind in (torch.dtype, torch.memory_format, torch.layout):
        if kind.__name__ in d:
            value = getattr(torch, d[kind.__name__])
            if isinstance(value, kind):
                return value
    raise ValueError(f"kiln: a cached graph describes a value kiln cannot rebuild: {sorted(d)}")


# ----------------------------------------------------------------------------- products on disk


def encode_product(target: str, source: str, wrapper: str, kernels: dict, namespace: dict, base: dict) -> dict:
    """The product of one compiled graph: `namespace` is the wrapper's before it ran, `base` the names every
    wrapper gets (not stored)."""
    names = {name: encode_value(value) for name, value in namespace.items()
             if not (name in base and base[name] is value)}
    signatures = {name: {"arg_names": list(k.arg_names), "size_args": [str(s) for s in k.size_args],
                         "reports_errors": bool(getattr(k, "reports_errors", False)),
                         "precompiles": record_precompiles(k)} for name, k in kernels.items()}
    return {"format": FORMAT, "target": target, "source": source, "wrapper": wrapper, "kernels": signatures,
            "namespace": names}


def record_binaries(product: dict, namespace: dict) -> None:
    """Note in `product` each Triton kernel's entries in Triton's cache (kiln/runtime/triton_cache.py), read off
    its launchers in the built wrapper's `namespace`: a warm process that finds them all in Triton's cache has
    nothing to compile, and starts no build workers. A kernel whose launchers recorded none is left without."""
    for name, signature in product["kernels"].items():
        module = getattr(namespace.get(name), "__globals__", {})
        entries = [getattr(module.get(launcher), "binaries", None) for launcher, _, _ in signature["precompiles"] or ()]
        if entries and all(entries):
            signature["binaries"] = sorted(set().union(*entries))
        stored = _store_binaries(module, signature["precompiles"] or ())
        if stored:
            signature["stored"] = stored


def _store_binaries(module: dict, precompiles) -> list | None:
    """Keep the binary each precompile of one kernel loaded in kiln's cache (kiln/runtime/triton_binaries.py); their
    descriptions in precompile order, or None unless every one was kept."""
    out = []
    for launcher, dtypes, ints in precompiles:
        binary = getattr(module.get(launcher), "compiled", {}).get((tuple(dtypes), tuple(ints)))
        described = triton_binaries.store(binary) if binary is not None else None
        if described is None:
            return None
        out.append(described)
    return out


def decode_product(product: dict, base: dict) -> tuple[dict, dict]:
    """(kernel name -> KernelSignature, the wrapper's namespace) of a product read back."""
    kernels = {name: KernelSignature(**sig) for name, sig in product["kernels"].items()}
    namespace = dict(base)
    namespace.update({name: decode_value(d) for name, d in product["namespace"].items()})
    return kernels, namespace


# The folders of whole-graph products: "graphs" (an ATen graph's kernels and wrapper, kept here) and "aot"
# (a captured graph's AOT autograd product, kiln/autograd/aot_cache.py). Each counts its own stores, and the
# hits its user counts: a product read back that does not load is no hit. What was made instead of taken from
# the cache, cacheable or not, is counted by the user too: "compiles" (graphs: ATen graphs run through the
# stages), "traces" (aot: variants traced). A warm process over a complete cache counts none of either.
FOLDERS = ("graphs", "aot")
folder_stats = {folder: {"hits": 0, "stores": 0, "uncacheable": 0, "compiles": 0, "traces": 0}
                for folder in FOLDERS}
stats = folder_stats["graphs"]


def product_path(key: str, folder: str = "graphs") -> Path:
    return cache.folder(folder, key[:2]) / f"{key}.json"


def lookup(key: str, folder: str = "graphs") -> dict | None:
    """The product stored under `key`, if there is one that matches its manifest (a broken one is removed,
    with one log line, and the graph compiled again)."""
    return cache.read_published(product_path(key, folder), _product)


def _product(data: bytes) -> dict:
    product = json.loads(data)
    if not isinstance(product, dict) or product.get("format") != FORMAT:
        raise cache.Unusable("not a product of this kiln")
    return product


def store(key: str, product: dict, folder: str = "graphs") -> None:
    """Publish `product` under `key` (a temporary file renamed into place, its manifest first)."""
    if cache.publish_new(product_path(key, folder), json.dumps(product), "the compiled graph"):
        folder_stats[folder]["stores"] += 1


def forget(key: str, folder: str = "graphs") -> None:
    """Remove a product that could not be used (it is compiled again and stored anew)."""
    discard(product_path(key, folder))


__all__ = ["graph_key", "describable", "encode_product", "decode_product", "record_binaries", "lookup", "store",
           "forget", "Uncacheable", "KernelSignature", "environment", "host", "stats", "folder_stats", "FOLDERS"]
