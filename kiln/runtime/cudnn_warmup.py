"""cuDNN's first calls, made while the compile builds its kernels rather than in the first step.

The first call of a cuDNN convolution in each configuration (sizes, strides, dtype, groups, ...) chooses its
algorithm and builds its execution plan: with `torch.backends.cudnn.benchmark` on it times every algorithm
(process-wide cache), off it still asks the heuristics and builds the plan. Eager and torch.compile pay this in
their first step: for a MobileNetV3 training step on an H100, about 30 s with the benchmark on (channels-last
depthwise convolutions, forward, input and weight gradients) and 3 s with it off.

kiln knows every convolution a graph will call, with the layouts it passes them, once its wrapper is generated
(kiln/codegen/conv_calls.py). One worker thread makes each such call once, on scratch tensors of those sizes,
strides, storage offsets and dtypes, while the compile goes on (the kernels build in other processes; a
training graph's backward is still to be lowered). The choice cuDNN caches is then the one the graph's own call
finds.

So that no algorithm is timed beside other GPU work, the worker runs one call at a time, first waits for the
work already queued on the device, and every compiled graph's call waits for the worker to be done
(`wait`, from `CompiledGraph.boxed_call`); the compile itself launches nothing on the GPU. Nothing starts while
the current stream captures a CUDA graph (the worker's allocations would invalidate the capture). A call that
fails here is left to fail, or not, where the graph makes it: this is a cache warm-up, and its errors are
logged at DEBUG only.

The scratch tensors hold a ramp of values rather than random numbers (the process's random streams are the
user's) or zeros (on which some kernels run faster than on data).
"""
from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass

import torch

log = logging.getLogger("kiln.runtime.cudnn_warmup")


@dataclass(frozen=True)
class ScratchTensor:
    """A tensor argument as the graph passes it: sizes, strides and storage offset in elements, its dtype."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype

    def make(self, device: torch.device) -> torch.Tensor:
        extent = self.offset + (0 if 0 in self.size else 1 + sum((n - 1) * s for n, s in zip(self.size, self.stride)))
        flat = torch.linspace(-1.0, 1.0, max(extent, 1), device=device).to(self.dtype)
        return flat.as_strided(self.size, self.stride, self.offset)


@dataclass(frozen=True)
class Call:
    """One ATen call to make once: `op` (an OpOverload) with `args`, a ScratchTensor where the graph passes a
    tensor and the value itself elsewhere (sizes, flags, None)."""

    op: object
    args: tuple

    def run(self, device: torch.device) -> None:
        args = [a.make(device) if isinstance(a, ScratchTensor) else a for a in self.args]
        self.op(*args)


_queue: queue.Queue = queue.Queue()
_worker: threading.Thread | None = None
_worker_lock = threading.Lock()
_made: set[Call] = set()  # calls this process queued once: cuDNN keeps what they found
# Calls queued and not yet made. Read on every compiled graph's call: a module attribute, one load when zero.
pending = 0
stats = {"made": 0, "failed": 0}


def start(calls: list[Call], device: str) -> None:
    """Queue `calls` (those not queued before in this process) for the worker, on `device`'s GPU; nothing on the
    CPU, without cuDNN, or while the current stream captures a CUDA graph."""
    global pending, _worker
    if not device.startswith("cuda") or not torch.cuda.is_available() or not torch.backends.cudnn.is_available() \
            or not torch.backends.cudnn.enabled or torch.cuda.is_current_stream_capturing():
        return
    new = [c for c in dict.fromkeys(calls) if c not in _made]
    if not new:
        return
    _made.update(new)
    with _worker_lock:
        pending += len(new)
        if _worker is None:
            _worker = threading.Thread(target=_work, name="kiln-cudnn-warmup", daemon=True)
            _worker.start()
    target = torch.device(device)
    _queue.put((target if target.index is not None else torch.device("cuda", torch.cuda.current_device()), new))


def wait() -> None:
    """Block until every queued call is made (before any compiled graph runs on the GPU)."""
    _queue.join()


def _work() -> None:
    global pending
    while True:
        device, calls = _queue.get()
        try:
            with torch.cuda.device(device), torch.no_grad():
                torch.cuda.synchronize()  # the work queued before: nothing else runs while algorithms are timed
                for call in calls:
                    _make(call, device)
        finally:
            with _worker_lock:
                pending -= len(calls)
            _queue.task_done()


def _make(call: Call, device: torch.device) -> None:
    try:
        call.run(device)
        torch.cuda.synchronize()
        stats["made"] += 1
    except Exception as e:  # noqa: BLE001 -- a warm-up: the graph's own call raises what is wrong, if anything
        stats["failed"] += 1
        log.debug("%s not made ahead (%s: %s)", call.op, type(e).__name__, e)
