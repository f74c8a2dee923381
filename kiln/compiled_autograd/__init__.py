"""Compiled autograd: the backward the autograd engine is about to run, captured into one FX graph at
`loss.backward()` / `torch.autograd.grad` time (hooks included) and compiled.

    with kiln.compiled_autograd.enable(lambda gm: kiln.compile(gm, fullgraph=True)):
        loss.backward()

`kiln.config.compiled_autograd = True` does the same for every backward that starts inside a
kiln-compiled function, with kiln's default backend. The engine's C++ hook does the graph walk and the
caching; kiln's tracer (`tracer.py`) builds the graph; `engine.py` holds what differs between torch
versions.
"""
from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable

import torch

from kiln.compiled_autograd import engine, ops
from kiln.compiled_autograd.tracer import AutogradGraphTracer, log, verbose_log
from kiln.config import config

__all__ = ["enable", "disable", "reset", "captured_graphs", "default_compiler"]

_depth = 0


@contextlib.contextmanager
def enable(compiler_fn: Callable | None = None, dynamic: bool = False):
    """Within this block every backward runs through compiled autograd: the engine's graph is captured
    once per structure, compiled by `compiler_fn(gm) -> callable` (kiln's default backend when None) and
    reused while the structure, hooks and static sizes stay the same.

    `dynamic=False` (torch's default too) starts with every size static and makes a size symbolic the
    first time it changes; True makes all sizes symbolic from the first capture.
    """
    global _depth
    compiler_fn = compiler_fn or default_compiler
    prior, prior_dynamic = engine.install(functools.partial(AutogradGraphTracer, compiler_fn), dynamic)
    reporter = _miss_reporter()
    if reporter is not None:
        engine.set_verbose_logger(reporter)
    _depth += 1
    try:
        with torch.autograd.set_multithreading_enabled(False):
            yield
    finally:
        _depth -= 1
        engine.install(prior, prior_dynamic)
        engine.set_verbose_logger(None)


def _miss_reporter() -> Callable[[str], None] | None:
    """Where the engine's cache-miss reasons go, if anyone listens: the engine only works them out (at
    a cost on every backward) while a logger is installed."""
    if verbose_log.isEnabledFor(logging.DEBUG):
        return verbose_log.debug
    if log.isEnabledFor(logging.INFO):  # the engine then passes the reasons to `log_compile_reasons`
        return lambda message: None
    return None


def is_enabled() -> bool:
    """Whether a backward started now would be captured (an `enable` block is open)."""
    return _depth > 0


def is_active() -> bool:
    """Whether a backward started inside a compiled region runs through compiled autograd: an `enable`
    block is open, or `kiln.config.compiled_autograd` turns it on for every compiled region. Capture
    then ends the graph before `.backward()` without counting a graph break (fullgraph=True allows it)."""
    return _depth > 0 or config.compiled_autograd


def disable():
    """A block where the engine runs eagerly even inside `enable`."""
    return engine.disabled()


def reset() -> None:
    """Forget every captured graph: the engine's cache and kiln's record of it. (The node functions the
    engine bound stay: it binds each once per process.)"""
    engine.clear_cache()
    ops.STATS.graphs.clear()


def captured_graphs() -> list:
    """The FX graphs captured since the last reset, oldest first."""
    return list(ops.STATS.graphs)


def default_compiler(gm: torch.fx.GraphModule) -> Callable:
    """kiln's default backend over a captured backward graph. kiln.compile sits above every stage, so
    kiln.api provides it (`set_default_compiler`) when kiln is imported."""
    if _default_compiler is None:
        raise RuntimeError("compiled autograd: no default compiler; import kiln, or pass compiler_fn")
    return _default_compiler(gm)


_default_compiler: Callable | None = None


def set_default_compiler(compiler_fn: Callable[[torch.fx.GraphModule], Callable]) -> None:
    global _default_compiler
    _default_compiler = compiler_fn
