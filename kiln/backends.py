"""The backend registry: the seam between capture and code generation.

A backend has torch.compile's contract: `backend(gm: torch.fx.GraphModule,
example_inputs: list[torch.Tensor]) -> callable`. `kiln.compile(backend=...)`
accepts a registered name or any such callable. Backends that take `mode` and
`options` (kiln's inductor) are registered with `takes_options=True` and are
called through a closure that binds them.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kiln.config import OPTIONS, CompileOptions, validate_options

Backend = Callable[[torch.fx.GraphModule, list], Callable]

log = logging.getLogger("kiln.backends")


@dataclass(frozen=True)
class _Entry:
    fn: Callable
    takes_options: bool


_REGISTRY: dict[str, _Entry] = {}


def register_backend(compiler_fn: Callable | None = None, *, name: str | None = None, takes_options: bool = False):
    """Register a backend under `name` (default: the function's name). Usable as a decorator."""

    def register(fn: Callable) -> Callable:
        key = name or fn.__name__
        if not callable(fn):
            raise TypeError(f"kiln.register_backend: {fn!r} is not callable")
        _REGISTRY[key] = _Entry(fn, takes_options)
        return fn

    return register(compiler_fn) if compiler_fn is not None else register


def list_backends() -> list[str]:
    """The names accepted by `kiln.compile(backend=...)`."""
    return sorted(_REGISTRY)


def resolve_backend(backend: Any, mode: str | None, options: dict | None) -> Backend:
    """Turn `backend`, `mode` and `options` into a callable with the backend contract. Two calls naming one
    backend with equal options get equal callables (the registered function itself where it takes none)."""
    if mode == "default":  # torch.compile drops mode="default" for every backend: it names no options
        mode = None
    if callable(backend) and not isinstance(backend, str):
        if mode is None and not options:
            return backend
        return _CallableWithOptions(backend, mode, options)
    if not isinstance(backend, str):
        raise TypeError(f"kiln.compile: backend must be a str or a callable, got {type(backend).__name__}")
    if backend not in _REGISTRY:
        raise ValueError(f"kiln.compile: unknown backend {backend!r}; known backends: {', '.join(list_backends())}")
    entry = _REGISTRY[backend]
    if not entry.takes_options:
        if mode is not None or options is not None:
            raise ValueError(f"kiln.compile: backend {backend!r} takes no mode or options")
        return entry.fn
    resolved = validate_options(mode, options)
    return _BoundBackend(entry.fn, resolved, backend)


class _CallableWithOptions:
    """A user's backend given a mode or options: they are passed on as keyword arguments, as torch.compile
    passes them (`backend(gm, example_inputs, mode=..., options=...)`); a backend that takes neither raises
    TypeError on the first compile, as under torch.compile."""

    def __init__(self, fn: Callable, mode: str | None, options: dict | None):
        self.fn = fn
        self.kwargs = {k: v for k, v in (("mode", mode), ("options", options)) if v}

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        return self.fn(gm, example_inputs, **self.kwargs)

    # equal for one backend given equal options: kiln.compile calls with both share their captures (kiln.api)
    def __eq__(self, other: object) -> bool:
        return type(other) is _CallableWithOptions and other.fn is self.fn and other.kwargs == self.kwargs

    def __hash__(self) -> int:
        return hash(id(self.fn))

    def __repr__(self) -> str:
        return f"{getattr(self.fn, '__name__', self.fn)!s}({self.kwargs})"


class _BoundBackend:
    """A backend with its resolved options bound; prints as `inductor(options it sets)`."""

    def __init__(self, fn: Callable, options: CompileOptions, name: str):
        self.fn, self.options, self.name = fn, options, name
        # kiln's own backends turn the cycle collector the capture paused on again where they start work that
        # may run long (an AOT trace, a compile: kiln/runtime/collector.py), not while loading from the cache
        self.resumes_collection = getattr(fn, "__module__", "").startswith("kiln.")

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        return self.fn(gm, example_inputs, options=self.options)

    # equal for one name resolved to equal options (`mode` and `options=` spelling them either way), as
    # torch.compile's inductor wrapper compares its config: kiln.compile calls with both share their captures
    def __eq__(self, other: object) -> bool:
        return (type(other) is _BoundBackend and other.fn is self.fn and other.name == self.name
                and other.options == self.options)

    def __hash__(self) -> int:
        return hash((id(self.fn), self.name))

    def __repr__(self) -> str:
        chosen = {k: v for k, v in self.options.as_dict().items() if v != OPTIONS[k].default}
        return f"{self.name}({chosen or ''})"


@register_backend
def eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Run the captured graph as it is: tells a capture bug from a code-generation bug."""
    return gm.forward


# kiln's code generator (kiln/pipeline.py): ATen graphs -> fused kernels (C++/OpenMP on CPU, Triton on CUDA).
from kiln.pipeline import inductor  # noqa: E402  (registered after the registry exists)

register_backend(name="inductor", takes_options=True)(inductor)


def torch_compile_backend(gm: torch.fx.GraphModule, example_inputs: list, mode: str | None = None,
                          options: dict | None = None) -> Callable:
    """`torch.compile(model, backend="kiln", mode=..., options=...)`: kiln's code generator behind torch's capture.

    The target of the `torch_dynamo_backends` entry point in pyproject.toml, through which torch finds
    backends by name. torch passes `mode` and `options` as keyword arguments (only when set); they mean
    what they mean for `kiln.compile` and are checked the same way (an unknown option names itself)."""
    return inductor(gm, example_inputs, validate_options(mode, options))


# The autograd stage's backend: ATen forward/backward graphs run op by op (kiln/autograd).
from kiln.autograd import aot_eager  # noqa: E402  (registered after the registry exists)

register_backend(name="aot_eager")(aot_eager)


# CUDA graphs over the same ATen graphs run op by op (kiln/runtime/cudagraphs.py). Defined here, where
# the stages meet, so that the runtime does not import the autograd stage above it.
from kiln.autograd import aot_compile  # noqa: E402  (registered after the registry exists)
from kiln.autograd.aot import run_graph  # noqa: E402
from kiln.runtime.cudagraphs import CUDAGraphPool  # noqa: E402


@register_backend(name="cudagraphs")
def cudagraphs(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The `"cudagraphs"` backend: kiln's ATen graphs, run op by op, recorded into CUDA graphs.

    Like `aot_eager` (kiln/autograd) with each inference, forward and backward graph
    recorded by kiln/runtime/cudagraphs.py: the launch overhead goes, the kernels are ATen's.
    """
    graph_id = gm.meta.get("kiln.graph_id") if isinstance(getattr(gm, "meta", None), dict) else None
    name = f"graph{graph_id}" if graph_id is not None else "cudagraphs"
    pool = CUDAGraphPool.for_graph(gm, example_inputs, name)
    if pool is None:
        return aot_compile(gm, example_inputs, run_graph, name=name)

    def compiler(aten_gm, inputs):
        return pool.wrap(run_graph(aten_gm, inputs), aten_gm, inputs)

    compiled = aot_compile(gm, example_inputs, compiler, name=name)
    compiled.cudagraph_pool = pool
    return compiled


def shares_by_value(compiler: Callable) -> bool:
    """Whether `compiler` is one `resolve_backend` made, which equals another it made for the same backend and
    options; any other callable is shared by identity (a user's backend object may not be hashable)."""
    return type(compiler) in (_BoundBackend, _CallableWithOptions)
