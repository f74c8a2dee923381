"""The C++/OpenMP target: all kernels of one graph in one translation unit."""
from __future__ import annotations

import ctypes
from pathlib import Path

from kiln.codegen.cpp.kernel import CppKernel, generate_kernel
from kiln.fallbacks import KernelBuildFailed
from kiln.runtime import cache
from kiln.schedule.fusion import Schedule

PRELUDE = (Path(__file__).parent / "prelude.h").read_text()


def generate_module(sched: Schedule) -> tuple[str, dict[str, CppKernel]]:
    """(C++ source of every kernel of `sched`, kernel name -> CppKernel with its argument lists)."""
    layouts = sched.graph.buffer_layouts()
    kernels = {g.name: _generate(g, layouts) for g in sched.kernels()}
    # A kernel equal to an earlier one up to names is an alias of its function (compiled once). Kernels never
    # call each other: each function and its aliases may go in their own translation unit (a parallel build).
    parts: dict[str, list[CppKernel]] = {}
    for k in kernels.values():
        parts.setdefault(k.canonical_source(), []).append(k)
    source = PRELUDE + "".join(
        f"\n{cache.UNIT_MARK}" + "\n".join([same[0].source] + [k.alias_of(same[0]) for k in same[1:]]) + "\n"
        for same in parts.values())
    return source, kernels


def _generate(group, layouts) -> CppKernel:
    try:
        return generate_kernel(group, layouts)
    except Exception as e:  # this kernel's ops run through ATen (kiln.fallbacks)
        raise KernelBuildFailed(group.name, "codegen", e) from e


def failing_kernel(kernels: dict[str, CppKernel]) -> str | None:
    """The first kernel whose function alone (after the prelude) the compiler rejects, if any: which
    kernel broke a build of them all."""
    checked = set()
    for name, k in kernels.items():
        canonical = k.canonical_source()
        if canonical not in checked and not cache.compiles(PRELUDE + k.source):
            return name
        checked.add(canonical)
    return None


def load_kernels(source: str, kernels: dict[str, CppKernel]) -> dict:
    """ctypes functions for each kernel, with argument types set (pointers, then int64 sizes); a kernel that
    checks values returns its error code (0: none)."""
    if not kernels:
        return {}
    try:
        lib = cache.load(source)
    except cache.CompilerTimeout:  # no kernel to blame, and checking each would wait as long again
        raise
    except cache.BuildError as e:
        name = failing_kernel(kernels)
        if name is None:
            raise
        raise KernelBuildFailed(name, "build", e) from e
    out = {}
    for name, k in kernels.items():
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p] * len(k.arg_names) + [ctypes.c_int64] * len(k.size_args)
        fn.restype = ctypes.c_int64 if k.reports_errors else None
        out[name] = fn
    return out
