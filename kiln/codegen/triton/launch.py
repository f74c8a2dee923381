"""Launching a generated kernel with little Python in the way.

`JITFunction[grid](...)` binds arguments, computes a specialization key and
looks the binary up on every call (tens of microseconds, more than many of
kiln's kernels take on the GPU). A `Launcher` does that once per
specialization and then calls the compiled binary's C launcher directly (below
even Triton's Python `CompiledKernel.run`), as Inductor's launchers do. The key
it checks per call is what Triton specializes on for these kernels: 16-byte
alignment of each tensor and, for each integer, whether it is 1, a multiple of
16, or too large for int32. Under the interpreter, or with Triton's launch hooks
set (profilers), every call goes through the JITFunction.
"""
from __future__ import annotations

import threading
import weakref
from functools import reduce
from operator import itemgetter, or_

import torch
import triton

from kiln.codegen.triton.libdevice import interpreting
from kiln.runtime import triton_cache

_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU-only builds
_RUNTIME = triton.knobs.runtime
# Triton loads a binary's handles on first use and sets its launcher (`run`) before its `function`: a thread
# reading both while another is loading the same binary (two launchers of one shared kernel, precompiled side
# by side) got function None, and the launch raised "argument 5 must be int, not None". Each binary has its own
# lock: a load builds the C launcher of the kernel's signature (a C compiler run where Triton's cache lacks it)
# and loads the binary onto the GPU, and one lock for all made a build's hundreds of loads run one at a time
# (most of a training graph's build on an H100, its threads waiting for the lock).
_load_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_load_locks_guard = threading.Lock()


def _loading(binary) -> threading.Lock:
    """The lock held while `binary`'s handles are read (and loaded, on first use)."""
    with _load_locks_guard:
        lock = _load_locks.get(binary)
        if lock is None:
            lock = _load_locks[binary] = threading.Lock()
        return lock


def _no_hooks() -> bool:
    """No launch hooks installed (Triton 3.6 keeps them as HookChains, empty by default; older ones as None)."""
    r = _RUNTIME
    return not getattr(r.launch_enter_hook, "calls", r.launch_enter_hook) and \
        not getattr(r.launch_exit_hook, "calls", r.launch_exit_hook)


def _hook_calls(hook) -> list | tuple:
    """What a launch hook as Triton loaded it runs: a HookChain's list of calls (which `add` fills in place), none
    for None, else the hook itself (a hook set before kiln was imported: never the fast path)."""
    return getattr(hook, "calls", () if hook is None else (hook,))


# The hooks as loaded and what they run, for the fast path's inline check (a function call per launch cost as much
# as the rest of the check): no hooks while both are the loaded objects and run nothing. A hook added to a chain
# fills its list; one assigned in its place fails the identity test.
_ENTER_HOOK, _EXIT_HOOK = _RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook
_ENTER_CALLS, _EXIT_CALLS = _hook_calls(_ENTER_HOOK), _hook_calls(_EXIT_HOOK)


def _direct_launch(binary) -> tuple:
    """(launch, head) such that `launch(gx, gy, 1, stream, *head, *args)` runs `binary`: its C launcher,
    skipping Triton's Python `CompiledKernel.run` (two nested functions built and a scratch check on every
    call), when the kernel needs no scratch memory; `binary.run` otherwise, or where Triton's launcher
    differs from 3.6's."""
    with _loading(binary):
        run, function = binary.run, binary.function
    triton_cache.record_launcher(run)  # the C launcher Triton built for this signature travels with artifacts
    launch = getattr(run, "launch", None)
    if launch is None or getattr(run, "global_scratch_size", 1) or getattr(run, "profile_scratch_size", 1) \
            or getattr(run, "num_ctas", 1) != 1:
        return run, (function, binary.packed_metadata, None, None, None)
    return launch, (function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                    binary.packed_metadata, None, None, None)


def _picker(check: tuple, num_tensors: int):
    """A function taking a launch's list of tensor addresses to those at positions `check` (one C call per
    launch, `itemgetter`), or None when every position is checked (the list itself) or none is."""
    if not check or check == tuple(range(num_tensors)):
        return None  # no check, or every address: the list itself
    if len(check) == 1:
        return itemgetter(check[0], check[0])  # a tuple even of one
    return itemgetter(*check)


def compiled_key(dtypes, ints) -> tuple:
    """How `Launcher.compiled` names one precompile: the dtypes by name (as a cached product writes them), the
    integers."""
    return tuple(str(d).removeprefix("torch.") for d in dtypes), tuple(ints)


def _int_key(v: int):
    return (v == 1, v % 16 == 0, v >= 2**31 or v < -2**31)


_data_ptr = torch.Tensor.data_ptr
# Launches that missed a launcher's fast path (another specialization, an unaligned tensor, hooks installed): a
# steady step should have none (benchmarks/warm_start.py reports them per step).
stats = {"slow_launches": 0}


class Launcher:
    """One kernel's launches. The fast path (`fast`) is the launch for 16-byte aligned tensors and the integer
    arguments it was specialized for (a graph's static sizes never change): per call it checks the integers
    (one tuple compare), the hooks and the alignment of the tensors that may be unaligned (one pass in C;
    none when every argument is a fresh allocation), and calls the C launcher. Anything else goes through
    the specialization table (`launches`) or the JITFunction."""

    def __init__(self, fn, num_tensors: int, num_warps: int, num_stages: int | None = None,
                 check_alignment: tuple | None = None, **constexprs):
        """`check_alignment`: the positions of the tensors that may be unaligned (default: all)."""
        self.fn = fn
        self.num_tensors = num_tensors
        self.check = tuple(range(num_tensors)) if check_alignment is None else tuple(check_alignment)
        self.checked = _picker(self.check, num_tensors)
        self.num_warps = num_warps
        # enable_fp_fusion off: eager rounds `a * b` before adding `c` (two ops, two roundings), where Triton
        # would contract the pair into one fused multiply-add, an ulp off eager's now and then (as the C++
        # target's -ffp-contract=off)
        self.options = {"num_warps": num_warps, "enable_fp_fusion": False}
        if num_stages is not None:
            self.options["num_stages"] = num_stages
        self.constexprs = constexprs
        self.const_values = tuple(constexprs.values())
        self.launches: dict = {}
        self.direct = not interpreting()
        self.fast = None
        self.fast_ints: tuple = ()
        # Triton's cache entries of the binaries loaded (kiln/runtime/triton_cache.py): a cached product records
        # them, and a warm process that finds them all compiles nothing in the build workers
        self.binaries: set[str] = set()
        # the binary each `precompile(dtypes, ints)` loaded, by (dtype names, ints): a cached product keeps them in
        # kiln's cache (kiln/runtime/triton_binaries.py), and a warm process hands them back through `adopt`
        self.compiled: dict[tuple, object] = {}

    def precompile(self, dtypes, ints) -> None:
        """Compile now (at graph compile time, where a failure falls back to ATen) rather than at the first call.

        `dtypes`: one per tensor argument; `ints`: the integer arguments (a stand-in where only known at run time).
        Tensors are taken as 16-byte aligned, as fresh allocations are.
        """
        if not self.direct:
            return
        binary = self.fn.warmup(*dtypes, *ints, grid=(1,), **self.constexprs, **self.options)
        self._record(binary)
        if binary is not None and _no_hooks():
            self._add(self._precompiled_key(dtypes, ints), binary, tuple(ints))
            self.compiled[compiled_key(dtypes, ints)] = binary

    def adopt(self, dtypes, ints, binary) -> bool:
        """Launch `binary` (a kernel compiled before, loaded from kiln's cache without Triton's JIT) for the
        arguments `precompile(dtypes, ints)` would have compiled it for, exactly as if it had: the same
        specialization table entry and fast path. False where it cannot be (launch hooks installed, the
        interpreter, or Triton failing to load it here): the caller then precompiles through the JIT."""
        if not self.direct or not _no_hooks():
            return False
        try:
            self._add(self._precompiled_key(dtypes, ints), binary, tuple(ints))
        except Exception:  # noqa: BLE001 -- not loadable here (nothing was added): Triton's JIT loads it, and
            return False  # raises what is wrong
        self.compiled[compiled_key(dtypes, ints)] = binary
        return True

    def _precompiled_key(self, dtypes, ints) -> tuple:
        """The specialization key of a precompile: every tensor aligned, the integers as given."""
        return tuple([True] * len(dtypes) + [_int_key(v) for v in ints])

    def _record(self, binary) -> None:
        entry = triton_cache.record_kernel(binary) if binary is not None else None
        if entry is not None:
            self.binaries.add(entry)

    def _add(self, key: tuple, binary, ints: tuple) -> None:
        self.launches[key] = launch = _direct_launch(binary)
        if all(key[:self.num_tensors]):
            self.fast, self.fast_ints = launch, ints

    def key(self, args) -> tuple:
        n = self.num_tensors
        return tuple([a.data_ptr() % 16 == 0 for a in args[:n]] + [_int_key(v) for v in args[n:]])

    def __call__(self, grid, *args) -> None:
        """`grid`: the number of programs, or a (programs, splits) pair for 2-D grids.

        The fast path hands the C launcher each tensor's address as an int: given a tensor, Triton's
        launcher calls its `data_ptr` method and asks the driver whether the pointer is a device pointer,
        about 0.35 us per tensor (BatchNorm kernels take a dozen). Every tensor is on the GPU: a graph with
        inputs on two devices never reaches a code generator (kiln.pipeline.decompose refuses it; it runs through
        ATen), and the wrapper allocates every other buffer on the graph's device."""
        fast, n, r = self.fast, self.num_tensors, _RUNTIME
        if fast is not None and args[n:] == self.fast_ints and not _ENTER_CALLS and not _EXIT_CALLS \
                and r.launch_enter_hook is _ENTER_HOOK and r.launch_exit_hook is _EXIT_HOOK:
            pointers = list(map(_data_ptr, args[:n]))
            checked = self.checked
            if not self.check or not reduce(or_, pointers if checked is None else checked(pointers)) & 15:
                gx, gy = (grid, 1) if type(grid) is int else grid
                fast[0](gx, gy, 1, _current_stream(args[0].get_device()), *fast[1], *pointers, *args[n:],
                        *self.const_values)
                return
        self._call(grid, args)

    def _call(self, grid, args) -> None:
        stats["slow_launches"] += 1
        gx, gy = (grid, 1) if isinstance(grid, int) else grid
        if self.direct:
            hooks = _no_hooks()
            key = self.key(args)
            launch = self.launches.get(key) if hooks else None
            if launch is not None:
                launch[0](gx, gy, 1, _current_stream(args[0].get_device()), *launch[1], *args, *self.const_values)
                return
            binary = self.fn[(gx, gy)](*args, **self.constexprs, **self.options)
            if hooks and binary is not None:  # a specialization not seen before
                self._record(binary)
                self._add(key, binary, tuple(args[self.num_tensors:]))
            return
        self.fn[(gx, gy)](*args, **self.constexprs, **self.options)
