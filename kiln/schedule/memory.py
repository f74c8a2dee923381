"""Memory planning over a Schedule: when each buffer dies, and which storage it reuses.

Buffers the wrapper holds: kernel outputs that are stored (not register-only),
extern results and their tuple items, and the graph's inputs. Each is released
right after its last reader runs (an input the graph never reads, before the
first step: `release_after[-1]`). The wrapper takes its inputs boxed (one list,
which it empties), so releasing an input drops the last reference to a tensor
no one else holds: a backward's saved activations die at their last use, as
eager's autograd nodes free theirs, instead of living to the end of the
backward. An input's storage is never reused: the caller may hold it too.

A kernel output is allocated in the storage of a released kernel output of the
same dtype and storage size when one exists (and is kept for that only when a
later allocation can use it). Graph outputs, buffers that a
graph output or an aliasing extern views, inputs (which a kernel may write into:
kiln/schedule/input_writes.py) and constants are never reused.

Kept across calls (`kept`): the outputs of kernels that read graph inputs alone
(`input_only_kernels`: in an inference graph, a convolution weight copied
channels-last). The wrapper computes them once per parameter version
(`kiln.codegen.wrapper.ParameterDerived`); they are never released or reused.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import sympy

from kiln.lower import ir
from kiln.lower.collectives import is_collective_start, is_wait
from kiln.schedule import deps
from kiln.schedule.fusion import ExternStep, KernelGroup, Schedule


def storage_numel(layout: ir.Layout):
    """Elements the layout spans (0 for an empty tensor)."""
    if any(s == 0 for s in layout.size):
        return sympy.Integer(0)
    if all(isinstance(x, (int, sympy.Integer)) for x in (*layout.size, *layout.stride)):  # static: no sympy
        return sympy.Integer(1 + sum((int(s) - 1) * int(st) for s, st in zip(layout.size, layout.stride)))
    return sympy.expand(1 + sum(((s - 1) * st for s, st in zip(layout.size, layout.stride)), sympy.Integer(0)))


@dataclass
class MemoryPlan:
    reuse: dict = field(default_factory=dict)       # new buffer -> released buffer whose storage it takes
    release_after: dict = field(default_factory=dict)  # step index -> buffers to drop after it
    allocated: list = field(default_factory=list)   # buffers the wrapper allocates (kernel outputs)
    kept: list = field(default_factory=list)        # kernels whose outputs are kept across calls

    def __str__(self) -> str:
        lines = [f"{new} reuses {old}" for new, old in self.reuse.items()]
        lines += [f"after step {k}: free {', '.join(v)}" for k, v in sorted(self.release_after.items()) if v]
        lines += [f"kept across calls: {group}" for group in self.kept]
        return "\n".join(lines)


def input_only_kernels(sched: Schedule) -> list[str]:
    """Kernels that read nothing but graph inputs and write no graph output: their results change only
    when those inputs do, so a graph whose inputs include the parameters may keep them across calls. A kernel
    that writes nothing (its values all overwritten before any read: `where(a > a, a, a)[:, 1:]` then filled) has
    nothing to keep.

    A kernel whose loops or layouts use a size symbol is left out: the kept computation runs outside the
    wrapper's `call`, where the symbols are not bound, and a size that varies between calls is not a
    parameter's (parameters have static sizes)."""
    inputs = {i.name for i in sched.graph.inputs}
    outputs = deps.output_buffers(sched.graph)
    found = []
    for group in sched.kernels():
        reads = step_reads(group)
        writes = set(step_writes(group))
        if reads and writes and reads <= inputs and not writes & outputs and sched.template_of(group) is None \
                and not _uses_size_symbols(group):
            found.append(group.name)
    return found


def _uses_size_symbols(group: KernelGroup) -> bool:
    """Whether the kernel or the buffers it allocates depend on a symbolic size."""
    sizes = [s for n in group.nodes for s in n.layout.size]
    return bool(group.size_symbols()) or any(sympy.sympify(s).free_symbols for s in sizes)


def step_writes(step) -> list[str]:
    if isinstance(step, KernelGroup):
        return [n.name for n in step.nodes if n.name not in step.local]
    return [step.node.name]


def step_reads(step) -> set[str]:
    if isinstance(step, KernelGroup):
        produced = {n.name for n in step.nodes}
        return {b for n in step.nodes for b in deps.reads(n)} - produced
    return ir.extern_reads(step.node)


def _hold_collective_inputs(sched: Schedule, last_use: dict[str, int]) -> None:
    """A collective's inputs live until its wait: c10d may still read them after the start returns, so their
    storage is neither reused nor freed while the communication runs."""
    started: dict[str, set[str]] = {}  # collective result -> the buffers it reads
    for k, step in enumerate(sched.steps):
        if not isinstance(step, ExternStep) or not isinstance(step.node, ir.Extern):
            continue
        if is_collective_start(step.node.op):
            started[step.node.name] = ir.extern_reads(step.node)
        elif is_wait(step.node.op):
            for result in ir.extern_reads(step.node) & started.keys():
                for b in started.pop(result):
                    last_use[b] = max(last_use.get(b, k), k)


def _released_inputs(graph: ir.LoweredGraph) -> list[str]:
    """The inputs the wrapper drops after their last use: all but those returned (an input, or a view of one,
    returned as an output; an input a kernel writes its new value into is returned as itself,
    kiln/schedule/input_writes.py)."""
    outputs = deps.output_buffers(graph)
    return [i.name for i in graph.inputs if i.name not in outputs]


def plan_memory(sched: Schedule, kept: list[str] = ()) -> MemoryPlan:
    """The plan for `sched`; `kept`: kernels (from `input_only_kernels`) whose outputs outlive the call."""
    graph = sched.graph
    layouts = graph.buffer_layouts()
    pinned = set(deps.output_buffers(graph)) | {i.name for i in graph.inputs}  # an input a kernel writes into
    for group in sched.kernels():
        if group.name in kept:
            pinned |= set(step_writes(group))
    for step in sched.steps:
        if isinstance(step, ExternStep) and isinstance(step.node, ir.Extern) and step.node.aliases_inputs:
            pinned |= ir.extern_reads(step.node) | {step.node.name}
    last_use: dict[str, int] = {}
    written_at: dict[str, int] = {}
    for k, step in enumerate(sched.steps):
        for b in step_writes(step):
            written_at[b] = k
            last_use.setdefault(b, k)
        for b in step_reads(step):
            last_use[b] = k
    _hold_collective_inputs(sched, last_use)
    reusable = {n.name for step in sched.kernels() for n in step.nodes
                if n.name not in step.local and n.name not in pinned}
    keys = {}  # buffer -> (storage size, dtype), computed once per buffer (a sympy expression each)
    for b in reusable:
        lay = layouts[b]
        keys[b] = (storage_numel(lay), lay.dtype)
    dying: dict[int, list[str]] = {}  # step -> buffers whose last use it is (in last_use's order)
    for b, last in last_use.items():
        if b not in pinned and b in written_at:
            dying.setdefault(last, []).append(b)
    for b in _released_inputs(graph):
        dying.setdefault(last_use.get(b, -1), []).append(b)

    future = Counter(keys.values())
    plan = MemoryPlan(kept=list(kept))
    if dying.get(-1):
        plan.release_after[-1] = dying[-1]
    pool: dict = {}
    for k, step in enumerate(sched.steps):
        for b in step_writes(step):
            if b in reusable:
                key = keys[b]
                future[key] -= 1
                if pool.get(key):
                    plan.reuse[b] = pool[key].pop()
                plan.allocated.append(b)
        released = dying.get(k, [])
        keep = []
        for b in released:
            if b in reusable and future[keys[b]] > 0:
                pool.setdefault(keys[b], []).append(b)
            else:
                keep.append(b)
        plan.release_after[k] = keep
    return plan
