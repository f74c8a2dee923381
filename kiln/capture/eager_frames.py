"""A frame kiln runs eagerly still compiles the modules it calls, as torch.compile's frame hook does.

kiln runs a frame eagerly where a continuation cannot resume after its break (inside a try block, a `with`
block of a manager kiln does not know) or where its capture failed. torch.compile skips such a frame too, but
its frame hook still compiles every function the frame goes on to call. transformers wraps each model's
forward in a try/finally (`capture_outputs`), so without this a data-dependent branch anywhere in a model
(OPT's layer drop, `if torch.rand([]) < self.layerdrop`) ran the whole model eagerly, its layers included.

Python gives kiln no frame hook. Modules are where the compiled code is, so while an eager frame runs,
`nn.Module.__call__` sends each call of a module whose forward is Python code outside torch through kiln
(`kiln.capture.entry.call_nested`, in the frame's compile context). Plain functions the frame calls run
eagerly, as before.

The class attribute is replaced only while some eager frame runs (a count under a lock), and it acts only in
the context (thread, task) that runs that frame: a module call in any other context sees no compile context and
runs as torch's own `__call__`. Within a module compiled this way the context is cleared, so the modules it
calls natively are compiled by its own program (or not) exactly as when the compiled frame runs alone.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

_context: contextvars.ContextVar[Any] = contextvars.ContextVar("kiln_eager_frame", default=None)
_torch_call = torch.nn.Module.__call__
_lock = threading.Lock()
_running = 0


def _call_through_kiln(module: torch.nn.Module, *args, **kwargs) -> Any:
    """`module(*args, **kwargs)`: through kiln when an eager frame of this context called it. A module whose
    forward is torch's own code (nn.Sequential, nn.Linear) runs as torch's, the modules it calls still sent to
    kiln: a model's blocks are often held in an nn.Sequential."""
    compiled_call = _context.get()
    if compiled_call is None or _forward_is_torchs(module):
        return _torch_call(module, *args, **kwargs)
    token = _context.set(None)
    try:
        return compiled_call(module, *args, **kwargs)
    finally:
        _context.reset(token)


def _forward_is_torchs(module: torch.nn.Module) -> bool:
    forward = getattr(type(module).forward, "__func__", type(module).forward)
    return (getattr(forward, "__module__", None) or "").startswith("torch.")


@contextlib.contextmanager
def modules_compiled(compiled_call: Callable[..., Any]) -> Iterator[None]:
    """Within the block (an eager frame's run), this context's module calls go to `compiled_call(module, *args,
    **kwargs)` (kiln.capture.entry `call_nested` in the frame's compile context)."""
    global _running
    with _lock:
        _running += 1
        if _running == 1:
            torch.nn.Module.__call__ = _call_through_kiln
    token = _context.set(compiled_call)
    try:
        yield
    finally:
        _context.reset(token)
        with _lock:
            _running -= 1
            if _running == 0:
                torch.nn.Module.__call__ = _torch_call


def run_eagerly(compiled_call: Callable[..., Any], eager: Callable[[], Any]) -> Any:
    """`eager()`, the frame's own code, with the modules it calls sent to `compiled_call`."""
    with modules_compiled(compiled_call):
        return eager()
