"""The process-wide compile lock: one compilation at a time, as torch.compile has.

Compiling touches process-global state that is not thread-safe: torch.fx's tracer patches
attributes through a global patcher (`CURRENT_PATCHER`), tracing installs dispatch modes, and
kiln's caches are looked up and then filled. Inference servers call compiled models from many
threads, so every compilation (a capture with its backend compile, a variant compiled on its first
call) holds this lock, and a thread that waited for it looks in the cache again before compiling.
Running compiled code never takes it.

Reentrant: a compilation can run compiled code (a backend's example run, a nested frame), which
may compile in turn.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

compile_lock = threading.RLock()

T = TypeVar("T")


def build_once(cache: dict, key: Hashable, build: Callable[..., T], *args) -> T:
    """`cache[key]`, built by `build(*args)` under the compile lock by the first thread that needs it.

    The unlocked read is the fast path of every call; only a miss takes the lock, and it looks
    again once it holds it, so concurrent first calls build one value, not one each.
    """
    try:
        return cache[key]
    except KeyError:
        pass
    with compile_lock:
        if key not in cache:
            cache[key] = build(*args)
        return cache[key]
