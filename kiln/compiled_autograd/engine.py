"""The seam to the autograd engine's C++ hook for compiled autograd, and what differs between torch versions.

The engine (`torch._C._dynamo.compiled_autograd`) walks the graph it is about to run, builds a cache key
from every node's structure, and on a miss instantiates the installed "autograd compiler" and calls its
methods while it re-walks the graph on fake values (`kiln.compiled_autograd.tracer` answers them). On a
hit it calls the compiled function it kept. Everything version-specific about that protocol lives here:

- `set_autograd_compiler(factory, dynamic)` returns `(prior_factory, prior_dynamic)`;
- `begin_capture(inputs, sizes, scalars, origins, *flags)` returns `(compile id, inputs, sizes, scalars)`,
  where the flags (accumulate_grad, check_nans) were added over time;
- `accumulate_grad(variable, grad, has_post_hooks)` (older) or
  `accumulate_grad(variable, variable_grad, grad, has_post_hooks)` (2.13: the current `.grad` is an
  explicit input of the graph rather than read off the tensor at run time).
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch._guards
from torch.fx.experimental.proxy_tensor import fetch_object_proxy

_hook = torch._C._dynamo.compiled_autograd


def install(factory: Callable[[], Any] | None, dynamic: bool) -> tuple[Any, bool]:
    """Make `factory` the engine's autograd compiler (None removes it); returns what was installed before."""
    prior = _hook.set_autograd_compiler(factory, dynamic)
    if isinstance(prior, tuple):
        return prior[0], bool(prior[1])
    return prior, False  # an engine whose setter returned only the prior factory


def clear_cache() -> None:
    """Forget every graph the engine cached (its shadow graph and the compiled functions on it)."""
    _hook.clear_cache()


def set_verbose_logger(log: Callable[[str], Any] | None) -> None:
    """Where the engine reports why its cache missed (a new node, a size that changed). Some engines call
    the object they are given, others its `.debug`: the adapter answers both."""
    global _miss_logger
    if hasattr(_hook, "set_verbose_logger"):
        # the engine keeps a borrowed reference: the adapter must live here as long as it is installed
        _miss_logger = None if log is None else _MissLogger(log)
        _hook.set_verbose_logger(_miss_logger)


_miss_logger = None


class _MissLogger:
    def __init__(self, log: Callable[[str], Any]) -> None:
        self.log = log

    def __call__(self, message: str, *args: Any) -> None:
        self.log(message % args if args else message)

    debug = __call__


def accumulate_grad_args(args: tuple) -> tuple[torch.Tensor, Any, Any, bool]:
    """`(variable, variable_grad, grad, has_post_hooks)` from either form of the engine's call.

    In the older form the graph reads `variable.grad` at run time: variable_grad is None here and
    `reads_grad_at_runtime` tells the graph to read it.
    """
    if len(args) == 4:
        variable, variable_grad, grad, has_post_hooks = args
        return variable, variable_grad, grad, bool(has_post_hooks)
    variable, grad, has_post_hooks = args
    return variable, None, grad, bool(has_post_hooks)


def begin_capture_result(compile_id: str, inputs: list, sizes: list, scalars: list) -> tuple:
    """What `begin_capture` returns to this engine: the compile id first where the engine expects one."""
    return (compile_id, inputs, sizes, scalars) if _RETURNS_COMPILE_ID else (inputs, sizes, scalars)


# The engine of torch >= 2.6 parses a 4-tuple (compile id, inputs, sizes, scalars) from begin_capture.
_RETURNS_COMPILE_ID = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 6)


def end_capture_result(runtime_wrapper: Callable, compiled_fn: Callable) -> Any:
    """What `end_capture` returns: (runner, compiled) where the engine calls
    `runner(compiled, inputs, sizes, scalars, hooks, packed_data)`; the oldest engines took the compiled
    function alone and called it with (inputs, sizes, hooks)."""
    return (runtime_wrapper, compiled_fn) if _RETURNS_COMPILE_ID else compiled_fn


def proxy_of(tracer: Any, value: Any) -> Any:
    """The proxy the dispatch-level tracer tracks for `value` (its signature changed in torch 2.5)."""
    try:
        return fetch_object_proxy(tracer, value)
    except TypeError:
        return fetch_object_proxy(tracer)(value)


@contextlib.contextmanager
def disabled():
    """The engine runs without a compiler inside: a compiled graph's own autograd calls stay eager."""
    prior, prior_dynamic = install(None, False)
    try:
        yield
    finally:
        install(prior, prior_dynamic)


@dataclass(frozen=True)
class GraphInputSource(torch._guards.Source):
    """Names entry `index` of a graph placeholder (`sizes[3]`) for the ShapeEnv, which requires a
    torch._guards.Source for every symbol it creates. torch 2.13 reads `name` as a property built from
    `_name_template`; older versions call `name()`: the class answers the way the installed torch asks."""

    placeholder: str = ""
    index: int = 0

    @property
    def _name_template(self) -> str:
        return f"{self.placeholder}[{self.index}]"

    def guard_source(self) -> torch._guards.GuardSource:
        return torch._guards.GuardSource.LOCAL


if not isinstance(torch._guards.Source.__dict__.get("name"), functools.cached_property):
    GraphInputSource.name = lambda self: self._name_template
