"""Launching a generated kernel with little Python in the way.

`JITFunction[grid](...)` binds arguments, computes a specialization key and
looks the binary up on every call (tens of microseconds, more than many of
kiln's kernels take on the GPU). A `Launcher` does that once per
specialization and then calls the compiled binary's `run` directly, as
Inductor's launchers do. The key it checks per call is what Triton specializes
on for these kernels: 16-byte alignment of each tensor and, for each integer,
whether it is 1, a multiple of 16, or too large for int32. Under the
interpreter, or with Triton's launch hooks set (profilers), every call goes
through the JITFunction.
"""
from __future__ import annotations

import torch
import triton

from kiln.codegen.triton.libdevice import interpreting


def _no_hooks() -> bool:
    """No launch hooks installed (Triton 3.6 keeps them as HookChains, empty by default; older ones as None)."""
    r = triton.knobs.runtime
    return not getattr(r.launch_enter_hook, "calls", r.launch_enter_hook) and \
        not getattr(r.launch_exit_hook, "calls", r.launch_exit_hook)


def _int_key(v: int):
    return (v == 1, v % 16 == 0, v >= 2**31 or v < -2**31)


class Launcher:
    def __init__(self, fn, num_tensors: int, num_warps: int, num_stages: int | None = None, **constexprs):
        self.fn = fn
        self.num_tensors = num_tensors
        self.num_warps = num_warps
        self.options = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps,
                                                                            "num_stages": num_stages}
        self.constexprs = constexprs
        self.const_values = tuple(constexprs.values())
        self.binaries: dict = {}
        self.direct = not interpreting()

    def precompile(self, dtypes, ints) -> None:
        """Compile now (at graph compile time, where a failure falls back to ATen) rather than at the first call.

        `dtypes`: one per tensor argument; `ints`: the integer arguments (a stand-in where only known at run time).
        Tensors are taken as 16-byte aligned, as fresh allocations are.
        """
        if not self.direct:
            return
        binary = self.fn.warmup(*dtypes, *ints, grid=(1,), **self.constexprs, **self.options)
        if binary is not None and _no_hooks():
            self.binaries[tuple([True] * len(dtypes) + [_int_key(v) for v in ints])] = binary

    def key(self, args) -> tuple:
        n = self.num_tensors
        return tuple([a.data_ptr() % 16 == 0 for a in args[:n]] + [_int_key(v) for v in args[n:]])

    def __call__(self, grid, *args) -> None:
        """`grid`: the number of programs, or a (programs, splits) pair for 2-D grids."""
        gx, gy = (grid, 1) if isinstance(grid, int) else grid
        if self.direct:
            hooks = _no_hooks()
            key = self.key(args)
            binary = self.binaries.get(key) if hooks else None
            if binary is not None:
                stream = torch._C._cuda_getCurrentRawStream(args[0].get_device())
                binary.run(gx, gy, 1, stream, binary.function, binary.packed_metadata, None, None, None,
                           *args, *self.const_values)
                return
            binary = self.fn[(gx, gy)](*args, **self.constexprs, **self.options)
            if hooks and binary is not None:
                self.binaries[key] = binary
            return
        self.fn[(gx, gy)](*args, **self.constexprs, **self.options)
