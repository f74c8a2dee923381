"""Python's cycle collector, paused while kiln captures a frame and loads its compiled product.

A capture makes many short-lived objects (value trackers, sources, fake tensors, the compile cache's JSON and the
graphs rebuilt from it). With the collector on, its young generations promote the ones alive at that moment, and
their count sets off full collections: each scans every object of the process (torch, the model, its parameters'
tensors), a fraction of a second for a transformer's process, for objects that reference counting frees anyway
when the capture ends. Paused (`paused()`), they are freed without ever being scanned.

What may run long or hold much memory resumes the collector (`resume()`): the AOT trace of a graph the compile
cache does not hold, the code generator's stages for a graph it compiles, and a backend that is not kiln's own.
A warm start pauses it for its whole capture. A collector the user turned off stays off.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_paused = False  # the collector is off because kiln turned it off (and turns it on again)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pause the collector for the block (nested blocks, and a collector already off, leave it as it is)."""
    global _paused
    with _lock:
        mine = gc.isenabled()
        if mine:
            gc.disable()
            _paused = True
    try:
        yield
    finally:
        if mine:
            resume()


def resume() -> None:
    """Turn the collector on again, if kiln paused it: what follows may run long or keep cyclic garbage."""
    global _paused
    with _lock:
        if _paused:
            _paused = False
            gc.enable()


__all__ = ["paused", "resume"]
