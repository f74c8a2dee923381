"""Making the Triton kernel of one fusion group: the launch configuration picks the kernel class.

A group whose configuration splits its reduction (and whose reductions can be split) becomes a
`SplitReductionKernel` (split.py); every other group a `TritonKernel` (kernel.py). The choice lives
here, above both classes, so that neither module imports the other's internals.
"""
from __future__ import annotations

from kiln.codegen.triton.heuristics import LaunchConfig, choose, unsplit
from kiln.codegen.triton.kernel import TritonKernel
from kiln.codegen.triton.split import SplitReductionKernel, splittable
from kiln.schedule.fusion import KernelGroup


def generate_kernel(group: KernelGroup, layouts: dict, external=None, config: LaunchConfig | None = None,
                    unaligned=None) -> TritonKernel:
    """`external`: buffers read outside their own kernel (or returned); others may stay in registers.
    `config`: the block sizes to use (default: the heuristic's choice). `unaligned`: the buffers whose
    alignment the launcher must check (default: all)."""
    config = config or choose(group, layouts)
    if config.kind == "split" and splittable(group):
        k = SplitReductionKernel(group, layouts, config, external=external, unaligned=unaligned)
    else:
        if config.kind == "split":
            config = unsplit(group, config)
        k = TritonKernel(group, layouts, config, external=external, unaligned=unaligned)
    k.source = k.generate()
    return k
