"""The autotuner (mode="max-autotune"): several implementations of one kernel, the fastest kept.

An `Autotuned` stands where the wrapper calls a kernel. It holds the candidates
(a label -> a callable taking the kernel's arguments: Triton launchers with other
block sizes / num_warps / num_stages, a matmul template, the extern ATen call).
On the first call with a given set of integer arguments (the sizes; a graph with
static shapes has one set) it:

  1. looks the decision up on disk: `$KILN_CACHE_DIR/autotune/<key[:2]>/<key>.json`,
     key = SHA-256 of the kernel's source (every candidate), the sizes and dtypes of
     the arguments and the device name; a later compile, in this process or
     another, reads the winner back and benchmarks nothing;
  2. otherwise times every candidate on the call's own arguments (the real inputs;
     a kernel only writes its outputs, so running it again is harmless), keeps the
     fastest, writes the decision, and logs it on logger `kiln.autotune` (INFO):
     kernel, candidates with their times, winner.

Timing: `triton.testing.do_bench` on CUDA tensors; on CPU tensors (the Triton
interpreter in the tests) a wall-clock mean, meaningless as a measure but the
same mechanism. A `timer(label, run) -> milliseconds` passed to `Autotuned` (or to
`benchmark`) replaces both: it is given each candidate's label and a function
running it once (tests give a deterministic one). A candidate that fails (compile error,
too much shared memory) times as infinity and is never chosen. While a CUDA
graph is being recorded nothing is benchmarked: the recorded call uses the
decision if there is one, else the first candidate (the heuristic default);
kiln's CUDA graphs run the graph once before recording, so the decision exists.

A progress bar (kernel, candidate k/n) shows on a terminal while benchmarking
runs past `kiln.config.progress_delay`, in the style of kiln/progress.py.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kiln.config import config
from kiln.runtime import cache
from kiln.runtime.private_files import unsafe_reason, write_atomic

log = logging.getLogger("kiln.autotune")

# What this process did: `tunings` kernels benchmarked, `timings` candidate measurements,
# `disk_hits` decisions read back from the cache. Tests read it.
stats = {"tunings": 0, "timings": 0, "disk_hits": 0}

CPU_REPEATS = 3


def decision_folder(key: str) -> Path:
    """The checked cache folder of decision `key` (kiln/runtime/private_files.py)."""
    return cache.folder("autotune", key[:2])


def device_name(args) -> str:
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.device.type == "cuda":
                return torch.cuda.get_device_name(a.device)
            return f"{a.device.type} (triton interpreter)" if os.environ.get("TRITON_INTERPRET", "0") != "0" \
                else a.device.type
    return "none"


def describe_args(args) -> list:
    """What the decision depends on besides the source: each tensor's size, stride and dtype, each integer."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append([list(a.shape), list(a.stride()), str(a.dtype).replace("torch.", "")])
        else:
            out.append(a if isinstance(a, (int, float, bool)) or a is None else repr(a))
    return out


def decision_key(source_hash: str, args) -> str:
    h = hashlib.sha256(source_hash.encode())
    h.update(json.dumps([describe_args(args), device_name(args)]).encode())
    return h.hexdigest()


def cuda_timer(label: str, fn: Callable[[], None]) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=5, rep=25))


def cpu_timer(label: str, fn: Callable[[], None]) -> float:
    fn()  # compile / warm up
    t = time.perf_counter()
    for _ in range(CPU_REPEATS):
        fn()
    return (time.perf_counter() - t) * 1000 / CPU_REPEATS


def default_timer(args) -> Callable[[str, Callable[[], None]], float]:
    cuda = any(isinstance(a, torch.Tensor) and a.device.type == "cuda" for a in args)
    return cuda_timer if cuda else cpu_timer


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class _Progress:
    """`kiln autotune <kernel> [candidate] k/n`: on a terminal only, after `config.progress_delay` seconds."""

    def __init__(self, name: str, total: int):
        self.bar = None
        stream = sys.stderr
        if not (hasattr(stream, "isatty") and stream.isatty()):
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        size = shutil.get_terminal_size((80, 24))
        self.name = name
        self.bar = tqdm(total=total, desc=f"kiln autotune {name}", leave=False, file=stream,
                        ncols=min(100, size.columns), delay=config.progress_delay,
                        bar_format="{desc} {bar} {n_fmt}/{total_fmt}")

    def advance(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(f"kiln autotune {self.name} [{label}]", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def pick(timings: dict[str, float]) -> str:
    """The label with the smallest time (the first listed on ties: the heuristic default comes first)."""
    best = min(timings.values())
    if math.isinf(best):
        raise RuntimeError("every candidate failed")
    return next(label for label, t in timings.items() if t == best)


def benchmark(name: str, candidates: dict[str, Callable], args: tuple,
              timer: Callable[[str, Callable[[], None]], float] | None = None) -> dict[str, float]:
    """Milliseconds of each candidate on `args` (infinity where it raised)."""
    timer = timer or default_timer(args)
    timings: dict[str, float] = {}
    progress = _Progress(name, len(candidates))
    try:
        for label, fn in candidates.items():
            stats["timings"] += 1
            try:
                timings[label] = float(timer(label, lambda fn=fn: fn(*args)))
            except Exception as e:  # a config that does not compile or does not fit: never chosen
                log.info("autotune %s: candidate %s failed (%s: %s)", name, label, type(e).__name__,
                         str(e).splitlines()[0] if str(e) else "")
                timings[label] = math.inf
            progress.advance(label)
    finally:
        progress.close()
    return timings


class Autotuned:
    """A kernel entry point choosing among `candidates` (label -> callable) by benchmark, once per size set.

    `source_hash` names the kernel's code (all candidates); `num_tensors`: leading tensor arguments
    (the rest are integer sizes, which select the decision); `timer(label, run) -> ms` replaces the default
    timing (do_bench on CUDA, wall clock on CPU); `use_cache=False` neither reads nor writes the disk.
    """

    def __init__(self, name: str, source_hash: str, candidates: dict[str, Callable], num_tensors: int,
                 timer: Callable | None = None, use_cache: bool = True):
        if not candidates:
            raise ValueError(f"autotune {name}: no candidates")
        self.name = name
        self.source_hash = source_hash
        self.candidates = dict(candidates)
        self.num_tensors = num_tensors
        self.timer = timer
        self.use_cache = use_cache
        self.chosen: dict[tuple, Callable] = {}   # integer arguments -> winning callable
        self.decisions: dict[tuple, dict] = {}    # integer arguments -> {"winner", "timings", "source"}

    def __call__(self, *args):
        fn = self.chosen.get(args[self.num_tensors:])
        if fn is None:
            fn = self._decide(args)
        return fn(*args)

    def _decide(self, args) -> Callable:
        sizes = args[self.num_tensors:]
        if len(self.candidates) == 1:  # nothing to choose: no benchmark, no cache file
            self.chosen[sizes] = next(iter(self.candidates.values()))
            return self.chosen[sizes]
        if _capturing():  # no benchmarking inside a CUDA graph recording
            label = self._read(decision_key(self.source_hash, args)) or next(iter(self.candidates))
            return self.candidates[label]
        key = decision_key(self.source_hash, args)
        label = self._read(key) if self.use_cache else None
        if label is not None:
            stats["disk_hits"] += 1
            self.decisions[sizes] = {"winner": label, "timings": None, "source": "disk"}
            log.info("autotune %s: %s (decision read from the cache, %d candidates)", self.name, label,
                     len(self.candidates))
        else:
            stats["tunings"] += 1
            timings = benchmark(self.name, self.candidates, args, self.timer)
            label = pick(timings)
            self.decisions[sizes] = {"winner": label, "timings": timings, "source": "benchmark"}
            first = next(iter(timings))
            log.info("autotune %s: %d candidates: %s; winner %s (%.4f ms; default %s %.4f ms)", self.name,
                     len(timings), ", ".join(f"{k} {v:.4f} ms" for k, v in timings.items()), label, timings[label],
                     first, timings[first])
            if self.use_cache:
                self._write(key, label, timings, args)
        self.chosen[sizes] = self.candidates[label]
        return self.chosen[sizes]

    def _read(self, key: str) -> str | None:
        """The label decided before for `key`, if a decision file names one of this kernel's candidates (anything
        else there, a broken or altered file, is ignored and benchmarked over)."""
        try:
            path = decision_folder(key) / f"{key}.json"
            if unsafe_reason(os.lstat(path), is_dir=False) is not None:
                return None
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        label = data.get("winner") if isinstance(data, dict) else None
        if not (isinstance(label, str) and label in self.candidates):
            return None
        cache.record_use(path)
        return label

    def _write(self, key: str, label: str, timings: dict, args) -> None:
        path = None
        try:
            path = decision_folder(key) / f"{key}.json"
            write_atomic(path, json.dumps({
                "kernel": self.name, "winner": label, "device": device_name(args), "args": describe_args(args),
                "timings_ms": {k: (v if math.isfinite(v) else None) for k, v in timings.items()}}, indent=1))
            cache.record_use(path)
        except OSError as e:  # a read-only cache directory: the decision still holds for this process
            log.info("autotune %s: could not write %s (%s)", self.name, path, e)


__all__ = ["Autotuned", "benchmark", "pick", "decision_key", "stats"]
