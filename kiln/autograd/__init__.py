"""The autograd stage: ATen-level forward and backward graphs, functionalized and partitioned.

`aot_compile(gm, example_inputs, compiler, decompositions=..., name=...)` is the
entry point the code generator uses; `aot_eager` is the backend that runs the
resulting ATen graphs as they are. See aot.py for the order of the passes.
"""
from kiln.autograd.aot import aot_compile, aot_eager

__all__ = ["aot_compile", "aot_eager"]
