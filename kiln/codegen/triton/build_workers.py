"""Triton kernels compiled in worker processes, side by side, before the graph's own process loads them.

Compiling one Triton kernel spends about a third of its time in Triton's Python front end (the AST walk
that emits TTIR), which holds the GIL; the build threads of `precompile_all` therefore share one core for
that part, and a training graph of several hundred kernels (DenseNet-121's backward has over 400) took
minutes on a 16-core GPU host. Inductor compiles in a pool of processes for the same reason.

How: one process (kiln/codegen/triton/build_worker_process.py, which imports of kiln only what a kernel module
imports) is started once per process (on the first
CUDA graph that will be built: before its autograd trace where the AOT cache misses, before its lowering where
the compile cache misses, so it imports torch and Triton meanwhile; a warm process starts none) and kept until
exit. It imports torch, Triton and kiln once and then forks the other workers, as Inductor's compile pool forks
its workers from one process: a worker started on its own spends seconds of CPU importing them, and sixteen
such starts on a GPU host (more where several compiles share it) competed with the graph's own trace for the
cores. It is told the GPU target, Triton's cache folder and one pair of pipes per worker, and needs no GPU: it
compiles behind a driver that only names the target, into Triton's on-disk cache. The graph's process then compiles each
kernel as before (`Launcher.precompile`), which finds the binary in that cache: the same source, target,
options and environment give the same cache key. Workers are a speed-up only: a kernel a worker did not
build (it failed, a worker died, the workers could not start) is compiled in the graph's process, where a
compile error makes the kernel fall back to ATen as before.

A request is one JSON line naming the kernel module's file and a launcher in it with the dtypes and
integers of its `precompile` (what `kiln.runtime.graph_cache.record_precompiles` records); the reply is one
JSON line, the compile error or null. Each worker has its own pair of pipes: its requests and its replies.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import inspect
import json
import logging
import os
import select
import subprocess
import sys
import threading
from collections.abc import Callable

import triton

from kiln.codegen.triton import build_worker_process
from kiln.codegen.triton.launch import _int_key
from kiln.runtime import cache, triton_cache
from kiln.runtime.current_device import made_current
from kiln.runtime.graph_cache import record_precompiles

log = logging.getLogger("kiln.codegen.triton")

_pool: BuildWorkers | None = None
_pool_lock = threading.Lock()


class BuildWorkers:
    """`count` worker processes compiling for `target` (Triton's GPUTarget as a list) into `cache_dir`.

    A build hands its requests out one at a time, the longest kernels first, to whoever is free: each ready
    worker and, while none is ready and the caller says how (`compile_here`), the graph's process itself, which
    would otherwise wait. A worker still starting (the leader importing torch and Triton) joins the build once it
    says it is ready: a small graph compiled right after the workers started is compiled in the graph's process,
    a big one there until the workers come, and nobody waits for a worker while requests are left."""

    def __init__(self, count: int, target: list, cache_dir: str):
        self.count, self.live = count, 0
        self.lock = threading.Lock()
        pipes = [(os.pipe(), os.pipe()) for _ in range(count)]  # per worker: (requests, replies), each (read, write)
        theirs = [[requests[0], replies[1]] for requests, replies in pipes]
        self.leader = subprocess.Popen([sys.executable, build_worker_process.__file__], stdin=subprocess.PIPE,
                                       stdout=subprocess.DEVNULL, env=_worker_env(), text=True,
                                       pass_fds=[fd for pair in theirs for fd in pair])
        for fd in (fd for pair in theirs for fd in pair):
            os.close(fd)
        self.workers = [_Channel(requests[1], replies[0]) for requests, replies in pipes]
        self.leader.stdin.write(json.dumps({"target": target, "cache_dir": cache_dir, "channels": theirs}) + "\n")
        self.leader.stdin.close()
        self.starting = list(self.workers)

    @property
    def pids(self) -> list[int]:
        """The process ids of the workers that said they are ready (the first is the leader's)."""
        return [w.pid for w in self.workers if w.pid is not None]

    def build(self, requests: list[dict], compile_here: Callable[[dict], None] | None = None) -> dict[int, str | None]:
        """Compile each request: {request index: the compile error, or None where it compiled}. `compile_here`
        compiles one request in the graph's process (raising its error), which takes requests only while no worker
        is ready (its compiles hold the GIL the build threads need to hand requests out); without it, a build that
        finds no worker ready compiles nothing. A request nobody compiled (its worker died) is left out: the graph's
        process compiles it."""
        # the workers that became ready since the last build, taken before this thread decides whether it compiles
        if not self.ready() and compile_here is None:
            return {}
        pending = list(range(len(requests)))[::-1]  # taken from the end: in order; list.pop is atomic
        done: dict[int, str | None] = {}

        def by_worker(worker: _Channel) -> None:
            while self._awaited(worker, pending):
                try:
                    k = pending.pop()
                except IndexError:
                    return
                reply = self._ask(worker, requests[k])
                if reply is None:  # the worker died: another takes its request
                    pending.append(k)
                    return
                done[k] = reply["error"]

        with concurrent.futures.ThreadPoolExecutor(self.count, thread_name_prefix="kiln-triton-worker") as pool:
            waits = [pool.submit(by_worker, w) for w in self.workers if w.state != "gone"]
            while compile_here is not None and pending and not self.live:  # only while no worker is ready
                try:
                    k = pending.pop()
                except IndexError:
                    break
                done[k] = _error_of(compile_here, requests[k])
            for wait in waits:
                wait.result()
        return done

    def ready(self) -> int:
        """Take the workers that said they are ready since the last call; the number alive."""
        with self.lock:
            for worker in list(self.starting):
                if select.select([worker.stdout], [], [], 0)[0]:
                    self.starting.remove(worker)
                    line = worker.stdout.readline()
                    if line:
                        worker.pid, worker.state = json.loads(line).get("pid"), "ready"
                        self.live += 1
                    else:  # it exited while starting
                        worker.state = "gone"
            return self.live

    def _awaited(self, worker: _Channel, pending: list) -> bool:
        """Whether `worker` is ready, waiting for a starting one only while requests are left."""
        while worker.state == "starting" and pending:
            select.select([worker.stdout], [], [], 0.05)
            self.ready()
        return worker.state == "ready"

    def _ask(self, worker: _Channel, request: dict) -> dict | None:
        """The worker's reply to `request` (one at a time per worker: builds may run side by side), or None where
        it exited."""
        with worker.busy:
            if worker.state != "ready":
                return None
            try:
                worker.stdin.write(json.dumps(request) + "\n")
                worker.stdin.flush()
                line = worker.stdout.readline()
            except OSError:
                line = ""
            if line:
                return json.loads(line)
            worker.state = "gone"
        log.info("Triton build worker %s exited", worker.pid)  # a crash in LLVM, killed
        with self.lock:
            self.live -= 1
        return None

    def close(self) -> None:
        """Close every worker's pipes (a worker exits at the end of its requests) and stop the leader, whose
        forked workers the kernel stops with it (`_die_with_parent`)."""
        for worker in self.workers:
            worker.close()
        if self.leader.poll() is None:
            self.leader.kill()
            self.leader.wait()


class _Channel:
    """The graph's process's ends of one worker's pipes: `stdin` takes its requests, `stdout` gives its replies
    (text, one JSON line each). `pid`: the worker's, once it said it is ready."""

    def __init__(self, requests: int, replies: int):
        self.stdin = os.fdopen(requests, "w")
        self.stdout = os.fdopen(replies, "r")
        self.pid: int | None = None
        self.state = "starting"  # then "ready", or "gone" once it exited
        self.busy = threading.Lock()  # held for one request and its reply

    def close(self) -> None:
        for pipe in (self.stdin, self.stdout):
            try:
                pipe.close()
            except OSError:  # a worker gone mid-request: its pipe was broken
                pass


def _error_of(compile_here: Callable[[dict], None], request: dict) -> str | None:
    """`compile_here(request)`'s error as a worker would reply it, or None where it compiled."""
    try:
        compile_here(request)
    except Exception as e:  # noqa: BLE001 - reported; the graph's process raises it again where it falls back
        return f"{type(e).__name__}: {e}"
    return None


def _worker_env() -> dict:
    """The parent's environment with no GPU for the workers to touch: they only compile (a CUDA context per
    worker would take GPU memory). They find kiln's modules where their own file is."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("TRITON_INTERPRET", None)
    return env


def start(device: str) -> BuildWorkers | None:
    """The process's workers for `device`'s GPU target, started on the first call (None: one core, or they could
    not start; kernels are then compiled in this process only)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = _started(worker_count(), device)
        return _pool or None


# Each worker imports torch, Triton and kiln (hundreds of MB resident): without KILN_BUILD_JOBS a host of many
# cores starts at most this many, as Inductor caps its compile workers.
DEFAULT_MAX_WORKERS = 32


def worker_count() -> int:
    """KILN_BUILD_JOBS (default: the CPUs this process may run on, at most DEFAULT_MAX_WORKERS), shared by the GPU
    processes of one host (LOCAL_WORLD_SIZE, as torchrun sets it): eight ranks do not start eight workers per
    core."""
    jobs = cache.build_jobs() if os.environ.get("KILN_BUILD_JOBS") else min(cache.build_jobs(), DEFAULT_MAX_WORKERS)
    return max(1, jobs // max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1)))


def _started(count: int, device: str) -> BuildWorkers | bool:
    if count <= 1 or _always_compiles():
        return False
    try:
        pool = BuildWorkers(count, _gpu_target(device), _triton_cache_dir())
    except Exception as e:  # noqa: BLE001 - workers are a speed-up; the build proceeds without them
        log.info("Triton build workers did not start (%s: %s); compiling in this process", type(e).__name__, e)
        return False
    atexit.register(pool.close)
    return pool


def _always_compiles() -> bool:
    """TRITON_ALWAYS_COMPILE: Triton's cache is bypassed, the graph's process would compile every kernel again."""
    return bool(getattr(getattr(triton, "knobs", None), "compilation", None)
                and getattr(triton.knobs.compilation, "always_compile", False))


def _gpu_target(device: str) -> list:
    with made_current(device):
        t = triton.runtime.driver.active.get_current_target()
    return [t.backend, t.arch, t.warp_size]


def _triton_cache_dir() -> str:
    return str(triton.knobs.cache.dir)


def requests_for(module, kernels: dict) -> list[dict]:
    """One request per distinct compile that `kernels` (name -> generated kernel) make in `module`, as plain data
    (a kernel whose compile arguments are not plain data is left to the graph's process, and one whose binaries
    Triton's cache holds already is left out). Launchers of one function (kernels equal up to names,
    kiln/codegen/triton/shared_kernels.py) with the same configuration and argument specialization are one
    compile."""
    requests, seen = [], set()
    for kernel in kernels.values():
        if triton_cache.all_cached(getattr(kernel, "binaries", None)):
            continue  # a cached product's kernel whose binaries Triton's cache holds: loaded, not compiled
        try:
            calls = record_precompiles(kernel) or []
        except Exception:  # noqa: BLE001 - Uncacheable, or a kernel whose precompile fails: the graph's process
            continue       # runs it again, where its error makes that one kernel fall back to ATen
        for name, dtypes, ints in calls:
            launcher = getattr(module, name)
            key = (id(launcher.fn), tuple(dtypes), tuple(map(_int_key, ints)), repr(launcher.constexprs),
                   repr(launcher.options))
            if key not in seen:
                seen.add(key)
                requests.append({"path": module.__file__, "module": module.__name__, "launcher": name,
                                 "dtypes": dtypes, "ints": ints})
    # The longest kernels first: a build ends with its slowest compile, and one handed out last started after the
    # others had finished (OPT's backward on an H200: 0.8 s alone at the end of a 1.3 s build).
    requests.sort(key=lambda request: -source_size(getattr(module, request["launcher"])))
    return requests


def source_size(launcher) -> int:
    """The length of a launcher's kernel source: how long its compile takes, roughly (Triton's JIT function keeps
    its source; the interpreter's wraps the Python function). 0 where there is none to read: the order of the
    requests is a speed-up only."""
    fn = getattr(launcher, "fn", None)
    src = getattr(fn, "src", None)
    if src is None:
        try:
            src = inspect.getsource(fn.fn)
        except (AttributeError, TypeError, OSError):
            return 0
    return len(src)
