"""Moving a kernel that computes a graph output later, where that lowers the peak of live bytes.

Lowering stores a value the graph returns where the graph computes it (kiln/lower/graph.py, as Inductor does),
so that what it reads dies there. That is a loss when the output is larger than what it frees: a backward's
float32 weight gradient cast from a bf16 matmul result holds twice the bytes from the cast on, through the
rest of the backward, where the activations' gradients peak. A graph output lives to the end wherever it
is computed, so such a kernel may run later at no cost but holding what it reads. Like Inductor's
`reorder_for_peak_memory` (torch/_inductor/memory.py), each one is placed where the simulated peak of live
bytes is lowest (before the first step that reads what it writes, or writes what it reads), and stays where
it is unless a place is strictly better.

The simulation counts what the wrapper holds (kiln/schedule/memory.py): every stored buffer and input from
its write (an input from the start) to its last reader, graph outputs to the end. Graphs with symbolic sizes
are left as they are: their bytes cannot be compared.
"""
from __future__ import annotations

import sympy

from kiln.lower import ir
from kiln.schedule import deps
from kiln.schedule.fusion import KernelGroup, Schedule
from kiln.schedule.memory import step_reads, step_writes, storage_numel


def sink_outputs_for_memory(sched: Schedule) -> int:
    """Move kernels that write only graph outputs later where that lowers the peak; returns how many moved."""
    sizes = _buffer_bytes(sched.graph)
    if sizes is None:
        return 0
    outputs = deps.output_buffers(sched.graph)
    inputs = {i.name for i in sched.graph.inputs}
    candidates = [s for s in sched.steps if isinstance(s, KernelGroup) and _writes_only_outputs(s, outputs, inputs)]
    moved = 0
    for step in reversed(candidates):
        moved += _sink(sched, step, sizes, outputs)
    return moved


def _writes_only_outputs(group: KernelGroup, outputs: set, inputs: set) -> bool:
    """A kernel whose every stored buffer is a graph output (alive to the end wherever it is computed), none a
    graph input (an input's new value stored in place)."""
    writes = step_writes(group)
    return bool(writes) and all(b in outputs and b not in inputs for b in writes)


def _buffer_bytes(graph: ir.LoweredGraph) -> dict[str, int] | None:
    """Bytes of each buffer's storage; None when a size is symbolic."""
    sizes = {}
    for name, layout in graph.buffer_layouts().items():
        numel = storage_numel(layout)
        if not isinstance(numel, (int, sympy.Integer)):
            return None
        sizes[name] = int(numel) * layout.dtype.itemsize
    return sizes


def _live_bytes(steps: list, sizes: dict, outputs: set, graph: ir.LoweredGraph) -> tuple[list[int], list[int]]:
    """(bytes live while each step runs, bytes freed right after it)."""
    born, last = {i.name: 0 for i in graph.inputs}, {}
    for k, step in enumerate(steps):
        for b in step_writes(step):
            born.setdefault(b, k)
        for b in step_reads(step):
            last[b] = k
    delta = [0] * (len(steps) + 1)
    freed = [0] * len(steps)
    for b, start in born.items():
        end = len(steps) - 1 if b in outputs else max(last.get(b, start), start)
        delta[start] += sizes.get(b, 0)
        delta[end + 1] -= sizes.get(b, 0)
        freed[end] += sizes.get(b, 0) if b not in outputs else 0
    live, total = [], 0
    for k in range(len(steps)):
        total += delta[k]
        live.append(total)
    return live, freed


def _sink(sched: Schedule, step: KernelGroup, sizes: dict, outputs: set) -> int:
    """Move `step` to the place after it where the peak is lowest, if strictly lower; 1 if it moved."""
    steps = sched.steps
    p = steps.index(step)
    reads, writes = step_reads(step), set(step_writes(step))
    later = len(steps)
    for k in range(p + 1, len(steps)):
        # not past a reader of what it writes (a forward's saved output read by the next matmul), nor past a
        # kernel writing into what it reads (an input's new value stored in place)
        if step_reads(steps[k]) & writes or set(step_writes(steps[k])) & reads:
            later = k
            break
    if later <= p + 1:
        return 0
    live, freed = _live_bytes(steps, sizes, outputs, sched.graph)
    last = {}
    for k, s in enumerate(steps):
        for b in step_reads(s):
            last[b] = k
    held = sum(sizes.get(b, 0) for b in reads if last.get(b) == p and b not in outputs)  # dies after `step`
    out = sum(sizes.get(b, 0) for b in step_writes(step))
    if out <= held:
        return 0  # later would hold more in between
    peak = max(live)
    before = max(live[:p], default=0)
    after = [0] * (len(steps) + 1)  # after[k]: the peak of steps k..end
    for k in range(len(steps) - 1, -1, -1):
        after[k] = max(live[k], after[k + 1])
    best, best_q, between = peak, None, 0
    for q in range(p + 1, later):
        between = max(between, live[q] + held - out)  # steps p+1..q run before it, without its output
        at_step = live[q] - freed[q] + held
        new_peak = max(before, between, at_step, after[q + 1])
        if new_peak < best:
            best, best_q = new_peak, q
    if best_q is None:
        return 0
    del steps[p]
    steps.insert(best_q, step)  # after the step that was at best_q (one place earlier once `step` is out)
    return 1
