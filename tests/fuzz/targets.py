"""Where the fuzzer runs a program: `--device cpu`, `cuda`, or `cpu-triton`.

`cpu-triton` is kiln's Triton target on the CPU, under Triton's interpreter: the programs made for the GPU
(whatever the GPU leaves undefined is left out of them), on CPU tensors, every graph's kernels generated as for
the GPU and interpreted. It finds the Triton code generator's bugs on a machine without one: a kernel reading
past a buffer (a segfault under the interpreter, garbage on a GPU), a literal Triton refuses. The interpreter is
slow, so its runs are small.
"""
from __future__ import annotations

TRITON_ON_CPU = "cpu-triton"
DEVICES = ("cpu", "cuda", TRITON_ON_CPU)


def program_device(device: str) -> str:
    """The device `programs.generate` writes the program for."""
    return "cuda" if device == TRITON_ON_CPU else device


def tensor_device(device: str) -> str:
    """Where the program's inputs live."""
    return "cpu" if device == TRITON_ON_CPU else device


def compile_options(device: str) -> dict:
    """kiln.compile's `options` for the device: the Triton code generator for CPU graphs on `cpu-triton`."""
    return {"cpu_backend": "triton"} if device == TRITON_ON_CPU else {}


def environment(device: str) -> dict[str, str]:
    """Variables the process needs before Triton loads (it reads TRITON_INTERPRET when its own functions are
    decorated, at import)."""
    return {"TRITON_INTERPRET": "1"} if device == TRITON_ON_CPU else {}
