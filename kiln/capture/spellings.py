"""torch.compile's own spellings in user code, honoured by kiln without importing torch._dynamo.

Code written for torch.compile calls `torch._dynamo.graph_break()`, wraps functions in
`torch.compiler.disable`, marks input dimensions with `torch._dynamo.mark_dynamic` and sets
`torch._dynamo.config.cache_size_limit`. kiln reads what those leave behind (the function's
name and module, the attributes the decorators and marks set, the config module the user
imported) so the same program behaves the same under kiln and under `python -m kiln run`.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

_DYNAMO_DEFAULT_LIMIT = 8  # torch._dynamo.config.recompile_limit's default: a value left alone is not a request


def _dynamo_function(fn: Any, name: str) -> bool:
    return getattr(fn, "__name__", None) == name and (getattr(fn, "__module__", "") or "").startswith("torch._dynamo")


# Functions that ask "am I being compiled?": True while kiln captures (transformers and others pick
# trace-friendly code by them). The older spelling `torch._dynamo.is_compiling` is recognised by name.
IS_COMPILING: set[Callable] = {torch.compiler.is_compiling}
if hasattr(torch.compiler, "is_dynamo_compiling"):
    IS_COMPILING.add(torch.compiler.is_dynamo_compiling)


def asks_is_compiling(fn: Any) -> bool:
    try:
        if fn in IS_COMPILING:
            return True
    except TypeError:  # an unhashable callable
        return False
    return _dynamo_function(fn, "is_compiling")


def is_graph_break(fn: Any) -> bool:
    """`kiln.graph_break` or `torch._dynamo.graph_break`: the call is an explicit break."""
    return getattr(fn, "__kiln_graph_break__", False) is True or _dynamo_function(fn, "graph_break")


def is_disabled(fn: Any) -> bool:
    """`kiln.disable` or `torch.compiler.disable` / `torch._dynamo.disable`: the call runs eagerly.

    torch's decorator marks its wrapper with `_torchdynamo_disable`; tracing into that wrapper would
    read dynamo's private state (its stance) instead of running the function.
    """
    return getattr(fn, "__kiln_disabled__", False) is True or getattr(fn, "_torchdynamo_disable", False) is True


def marked_dims(t: Any) -> tuple[set, set]:
    """(dynamic, static) dimensions marked on tensor `t` by kiln's or torch's mark_dynamic / mark_static.

    `maybe_mark_dynamic` (torch's weak mark) counts as dynamic, as it does for kiln's own.
    """
    dynamic = set(getattr(t, "_kiln_dynamic_dims", ()))
    dynamic |= set(getattr(t, "_dynamo_dynamic_indices", ())) | set(getattr(t, "_dynamo_weak_dynamic_indices", ()))
    static = set(getattr(t, "_kiln_static_dims", ())) | set(getattr(t, "_dynamo_static_indices", ()))
    return dynamic, static


def recompile_limit(own: int, own_default: int) -> int:
    """Entries kept per code object: kiln's `config.cache_size_limit`, or torch's when only torch's was set.

    torch's setting is read only from a `torch._dynamo.config` the program imported (kiln imports none).
    """
    dynamo_config = sys.modules.get("torch._dynamo.config")
    if own != own_default or dynamo_config is None:
        return own
    theirs = getattr(dynamo_config, "recompile_limit", None)
    if theirs is None:
        theirs = getattr(dynamo_config, "cache_size_limit", _DYNAMO_DEFAULT_LIMIT)
    return theirs if theirs != _DYNAMO_DEFAULT_LIMIT else own
