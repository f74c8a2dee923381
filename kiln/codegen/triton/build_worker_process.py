"""The build worker processes' side of kiln/codegen/triton/build_workers.py: compile Triton kernels for a GPU
target into Triton's on-disk cache, with no GPU.

The first worker is started as `python <this file>`, not `python -m kiln.codegen.triton...`: a module of the
kiln package runs kiln's package `__init__`, which imports the whole compiler (capture, lowering, sympy, torch's
decompositions and meta functions) and cost the worker's start about as much CPU again as torch's own import,
while every kernel sat waiting for a worker or was compiled in the graph's process. A kernel module needs
torch, Triton and two kiln modules (its helpers and its launcher class); the worker imports those, with kiln's
packages as shells that find their modules and skip their `__init__` (`_kiln_packages_as_shells`). Everything
the worker needs before that is the standard library, imported here at the top.

The first worker readies Triton's per-process state (the hash of its installation, the target's backend)
before it forks the others, which inherit it instead of each computing it on its first kernel.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

KILN_ROOT = Path(__file__).resolve().parents[2]
# the packages a kernel module's imports go through (`kiln.codegen.triton.helpers`, `.launch`)
SHELLED_PACKAGES = ("kiln", "kiln.codegen", "kiln.codegen.triton")


class TargetOnlyDriver:
    """What Triton's JIT asks of the active driver to compile (not launch) a kernel: the target, a device, a
    stream. The workers never load a binary (nor do the tests and benchmarks that compile for sm_90 without a
    GPU, which install it too)."""

    def __init__(self, target):
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device=None) -> int:
        return 0


def compile_request(request: dict, modules: dict) -> None:
    """Compile the launcher `request` names (its module imported once per worker, from the same file and under
    the same name as in the graph's process: Triton's cache key hashes the kernel's source)."""
    import torch

    module = modules.get(request["path"])
    if module is None:
        spec = importlib.util.spec_from_file_location(request["module"], request["path"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[request["module"]] = module
        spec.loader.exec_module(module)
        modules[request["path"]] = module
    launcher = getattr(module, request["launcher"])
    dtypes = [getattr(torch, d) for d in request["dtypes"]]
    binary = launcher.fn.warmup(*dtypes, *request["ints"], grid=(1,), **launcher.constexprs, **launcher.options)
    _build_c_launcher(binary)


def _build_c_launcher(binary) -> None:
    """Build the C launcher of `binary`'s signature into Triton's cache, where the graph's process finds it when it
    loads the kernel. Triton builds one per signature on a kernel's first load (a C compiler run, about 0.3 s): in
    the graph's process those builds ran after the workers' compiles, about a second of each training graph's
    build on a GPU host; here they run beside the other workers' compiles. A launcher that cannot be built here
    (no CUDA driver library on the machine, another Triton) is built on load, as before."""
    if binary is None or getattr(binary.metadata.target, "backend", None) != "cuda":
        return
    try:
        from triton.backends.nvidia.driver import CudaLauncher

        CudaLauncher(binary.src, binary.metadata)
    except Exception:  # noqa: BLE001 - a speed-up only: the load builds it
        pass


def _kiln_packages_as_shells() -> None:
    """Register kiln's packages that kernel modules import through as empty packages that find their modules
    where kiln is, without running their `__init__` (see the module docstring). A module imported through them
    is kiln's own, from the same file."""
    for name in SHELLED_PACKAGES:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(KILN_ROOT.parent.joinpath(*name.split(".")))]
        sys.modules[name] = shell = importlib.util.module_from_spec(spec)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, shell)


def _ready_for_kernels(target) -> None:
    """Import what every kernel module imports and compute what Triton computes once per process on its first
    compile: the hash of its installation (it reads libtriton, hundreds of MB) and the target's backend (the
    version of ptxas, asked of a subprocess). Done in the first worker, the others inherit them when forked."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import triton_key

    import kiln.codegen.triton.helpers  # noqa: F401 -- what a kernel module imports, once for every fork
    import kiln.codegen.triton.launch  # noqa: F401

    triton_key()
    make_backend(target).hash()


def lead(init: dict) -> None:
    """The first worker: set the target and cache folder (its forks inherit both), fork a worker for each pipe
    pair after the first, and serve the first itself. Each worker closes the others' pipes, so that a reply pipe
    ends (its worker gone) where its one worker exits."""
    import triton
    from triton.backends.compiler import GPUTarget

    target = GPUTarget(*init["target"])
    triton.runtime.driver.set_active(TargetOnlyDriver(target))
    triton.knobs.cache.dir = init["cache_dir"]
    _ready_for_kernels(target)
    channels = init["channels"]
    for k, (requests, replies) in enumerate(channels[1:], 1):
        if os.fork() == 0:  # a worker: torch, Triton and kiln imported already
            _die_with_parent()
            _close_all_but(channels, k)
            _serve_channel(requests, replies)
            os._exit(0)  # not the leader's exit handlers
    _close_all_but(channels, 0)
    _serve_channel(*channels[0])


def _close_all_but(channels: list, keep: int) -> None:
    for k, pair in enumerate(channels):
        if k != keep:
            for fd in pair:
                os.close(fd)


def _die_with_parent() -> None:
    """A forked worker is stopped with the leader (Linux: PR_SET_PDEATHSIG), which the graph's process stops at
    its exit; elsewhere it stops at the end of its requests (its pipe closes with the graph's process)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serve_channel(requests: int, replies: int) -> None:
    with os.fdopen(requests, "r") as lines, os.fdopen(replies, "w") as out:
        serve(lines, out)


def serve(lines, out) -> None:
    """A worker's loop: a line saying it is ready (with its process id), then one reply line per request line."""
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    modules: dict = {}
    for line in lines:
        try:
            compile_request(json.loads(line), modules)
            error = None
        except Exception as e:  # noqa: BLE001 - reported; the graph's process compiles it again and falls back
            error = f"{type(e).__name__}: {e}"
        out.write(json.dumps({"error": error}) + "\n")
        out.flush()


if __name__ == "__main__":
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # run as a file: its folder's modules (kernel.py, ops.py, ...) are not top-level modules
    _kiln_packages_as_shells()
    lead(json.loads(sys.stdin.readline()))
