"""The process-wide compile lock: one compilation at a time, as torch.compile has.

Compiling touches process-global state that is not thread-safe: torch.fx's tracer patches
attributes through a global patcher (`CURRENT_PATCHER`), tracing installs dispatch modes, and
kiln's caches are looked up and then filled. Inference servers call compiled models from many
threads, so every compilation (a capture with its backend compile, a variant compiled on its first
call) holds this lock, and a thread that waited for it looks in the cache again before compiling.
Running compiled code never takes it.

Reentrant: a compilation can run compiled code (a backend's example run, a nested frame), which
may compile in turn.

While a thread holds it, the cyclic garbage collector makes no full (oldest-generation) collections.
A compile grows the heap by hundreds of thousands of objects (FX nodes, fake tensors, sympy
expressions, IR), and CPython starts a full collection each time the objects surviving into the
oldest generation grow by a quarter: every one walks the whole heap (the user's program, torch,
the compile so far), so their cost grows with the graph faster than the compile's own work. The
young generations are still collected, so short-lived cycles are freed as before; the oldest
generation's threshold is restored when the outermost compilation releases the lock, and the next
full collection then runs at the collector's usual pace.
"""
from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

# the oldest generation's threshold while a compile runs: no full collection starts
_PAUSED = 1 << 30


class CompileLock:
    """A reentrant lock (`with compile_lock:`) that pauses full collections while held (module docstring)."""

    def __init__(self):
        self._lock = threading.RLock()
        self._depth = 0  # changed only by the thread holding the lock
        self._thresholds: tuple | None = None

    def __enter__(self) -> CompileLock:
        self._lock.acquire()
        self._depth += 1
        if self._depth == 1:
            self._thresholds = gc.get_threshold()
            gc.set_threshold(*self._thresholds[:2], _PAUSED)
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None
        self._lock.release()


compile_lock = CompileLock()

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
