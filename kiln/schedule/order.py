"""Moving a kernel that computes a graph output later, where that lowers the peak of live bytes.

Lowering stores a value the graph returns where the graph computes it (kiln/lower/graph.py, as Inductor does),
so that what it reads dies there. That is a loss when the output is larger than what it frees: a backward's
float32 weight gradient cast from a bf16 matmul result holds twice the bytes from the cast on, through the
rest of the backward, where the activations' gradients peak. A graph output lives to the end wherever it
is computed, so such a kernel may run later at no cost but holding what it reads. Like Inductor's
`reorder_for_peak_memory` (torch/_inductor/memory.py), each one is placed where the simulated peak of live
bytes is lowest (before the first step that reads what it writes or reads, or writes what it reads), the
latest such place. Kernels that meet there are fused, as the scheduler fuses siblings: where the peak lies
elsewhere (the start of a large model's backward), a backward's gradient casts gather at its end, one launch
per shape.

The simulation counts what the wrapper holds (kiln/schedule/memory.py): every stored buffer and input from
its write (an input from the start) to its last reader, graph outputs to the end. Graphs with symbolic sizes
are left as they are: their bytes cannot be compared.
"""
from __future__ import annotations

import sympy

from kiln.lower import ir
from kiln.schedule import deps
from kiln.schedule.fusion import KernelGroup, Schedule, Segment, merge_independent_segments, try_add
from kiln.schedule.memory import step_reads, step_writes, storage_numel


def sink_outputs_for_memory(sched: Schedule) -> int:
    """Move kernels that write only graph outputs later where that lowers the peak, or as late as the peak
    allows, and fuse those that meet; returns how many moved."""
    sizes = _buffer_bytes(sched.graph)
    if sizes is None:
        return 0
    outputs = deps.output_buffers(sched.graph)
    inputs = {i.name for i in sched.graph.inputs}
    candidates = [s for s in sched.steps if isinstance(s, KernelGroup) and _writes_only_outputs(s, outputs, inputs)
                  and sched.template_of(s) is None]
    if not candidates:
        return 0
    order = _Order(sched, sizes, outputs, inputs)
    moved = sum(order.sink(step) for step in reversed(candidates))
    _fuse_neighbours(order, set(map(id, candidates)))
    return moved


def _fuse_neighbours(order: _Order, movable: set[int]) -> None:
    """Within each run of neighbouring output-only kernels (`movable`, by id), fuse each into the first earlier
    kernel of the run whose loops take it (the scheduler's horizontal rule) where the peak stays as it is:
    kernels sunk to the same place, such as a backward's float32 gradient casts at its end, are one launch
    per shape, as they were when all were computed there."""
    live, peak, steps, out, k = order.live, order.after[0], order.steps, [], 0
    while k < len(steps):
        end = k
        while end < len(steps) and id(steps[end]) in movable:
            end += 1
        if end == k:
            out.append(steps[k])
            k += 1
            continue
        costs = [order.costs(r) for r in range(k, end)]
        out += _fused_run(steps[k:end], live[k:end], costs, peak)
        k = end
    steps[:] = out


def _fused_run(run: list[KernelGroup], live: list[int], costs: list[tuple[int, int]], peak: int) -> list:
    """The kernels of one run, each fused into the first earlier one that takes it without raising `peak`:
    fused into the kernel at run position i, the one at j stores its outputs there and frees its inputs
    there, so the bytes live between i and j change by (its outputs - its dying inputs), `costs[j]`. Not into
    a kernel before one whose output it reads: the merged kernel would read that output before it is
    written. `live`: bytes live while each kernel of the run runs, updated as kernels fuse."""
    live = list(live)
    fused: list[tuple[int, KernelGroup]] = []  # (run position, kernel)
    for j, group in enumerate(run):
        held, stored = costs[j]
        reads = step_reads(group)
        first = next((f for f in range(len(fused) - 1, -1, -1) if reads & set(step_writes(fused[f][1]))), 0)
        for f in range(first, len(fused)):
            i, kernel = fused[f]
            if max([live[i] + stored, *(live[t] + stored - held for t in range(i + 1, j))]) > peak:
                continue
            merged = _merged(kernel, group)
            if merged is not None:
                fused[f] = (i, merged)
                live[i] += stored
                for t in range(i + 1, j):
                    live[t] += stored - held
                live[j] -= held
                break
        else:
            fused.append((j, group))
    return [kernel for _, kernel in fused]


def _merged(first: KernelGroup, second: KernelGroup) -> KernelGroup | None:
    """`first` with `second`'s nodes added, or None when a node does not fit its loops, a register-only value
    of either would have to be stored, or the merged kernel would walk its rows more often than either kernel
    alone (`first` is left unchanged).

    Nodes join as the scheduler adds them, then independent inner segments share a loop as the scheduler's
    (`merge_independent_segments`). Two batch norms' statistics that meet here (the first one's kernel moved
    past a convolution to the second's) thus share one loop; left as two loops, the kernel could neither split
    its rows across programs nor read its inputs once."""
    if first.orders or second.orders:
        return None
    trial = KernelGroup(first.name, first.outer, first.inner, [Segment(s.inner, list(s.nodes)) for s in first.segments],
                        local=first.local | second.local)
    if not all(try_add(trial, node) for node in second.nodes):
        return None
    merge_independent_segments(trial)
    if _loops(trial) > max(_loops(first), _loops(second)):
        return None
    return trial if all(_still_local(trial, name) for name in trial.local) else None


def _loops(group: KernelGroup) -> int:
    """How many times `group` walks its inner (reduced) dims: its inner segments."""
    return sum(1 for s in group.segments if s.inner)


def _still_local(group: KernelGroup, name: str) -> bool:
    """Whether a register-only value of a fused kernel is still read only where it is in a register: a pointwise
    value of an inner segment in that segment (the scheduler's `_mark_local` rule)."""
    k, node = group.segment_of(name)
    if not group.segments[k].inner or node.is_reduction():
        return True
    return all(group.segment_of(n.name)[0] == k for n in group.nodes if name in deps.reads(n))


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


class _Order:
    """The schedule's steps with what each reads and writes (computed once: a step's reads walk its IR) and the
    live bytes of their order, computed once and updated as steps move."""

    def __init__(self, sched: Schedule, sizes: dict, outputs: set, inputs: set):
        self.steps, self.sizes, self.outputs = sched.steps, sizes, outputs
        self.reads = [step_reads(s) for s in self.steps]
        self.writes = [set(step_writes(s)) for s in self.steps]
        n = len(self.steps)
        born, last = dict.fromkeys(inputs, 0), {}
        for k in range(n):
            for b in self.writes[k]:
                born.setdefault(b, k)
            for b in self.reads[k]:
                last[b] = k
        delta, self.dying = [0] * (n + 1), [set() for _ in range(n)]  # dying[k]: what step k reads last
        for b, start in born.items():
            size = sizes.get(b, 0)
            end = n - 1 if b in outputs else max(last.get(b, start), start)
            delta[start] += size
            delta[end + 1] -= size
            if b not in outputs and b in last:
                self.dying[end].add(b)
        self.live, total = [], 0  # bytes live while each step runs
        for k in range(n):
            total += delta[k]
            self.live.append(total)
        self.freed = [sum(sizes.get(b, 0) for b in dying) for dying in self.dying]  # bytes freed after each step
        self._suffix_peaks()

    def _suffix_peaks(self) -> None:
        """`after[k]`: the peak of the steps from k to the end."""
        self.after = [0] * (len(self.live) + 1)
        for k in range(len(self.live) - 1, -1, -1):
            self.after[k] = max(self.live[k], self.after[k + 1])

    def costs(self, k: int) -> tuple[int, int]:
        """(bytes of what step `k` reads for the last time, bytes of what it stores)."""
        return self.freed[k], sum(self.sizes.get(b, 0) for b in self.writes[k])

    def sink(self, step: KernelGroup) -> int:
        """Move `step` to the place after it where the peak is lowest, the latest of those where it is no
        higher than now; 1 if it moved."""
        p = self.steps.index(step)
        live, after = self.live, self.after
        reads, writes = self.reads[p], self.writes[p]
        held, out = self.costs(p)
        if out <= held:
            return 0  # later would hold more in between
        best, best_q, between, before = after[0], None, 0, max(live[:p], default=0)
        touched = writes | reads
        for q in range(p + 1, len(self.steps)):
            # not past a reader of what it writes (a forward's saved output read by the next matmul) or of
            # what it reads (which would then live longer), nor past a kernel writing into what it reads (an
            # input's new value stored in place)
            if not (self.reads[q].isdisjoint(touched) and self.writes[q].isdisjoint(reads)):
                break
            between = max(between, live[q] + held - out)  # steps p+1..q run before it, without its output
            at_step = live[q] - self.freed[q] + held
            peak = max(before, between, at_step, after[q + 1])
            if peak <= best:
                best, best_q, best_live = peak, q, at_step
        if best_q is None:
            return 0
        for t in range(p + 1, best_q + 1):  # they run before it now: its inputs live, its outputs not yet
            live[t] += held - out
        live[p] = best_live
        for order in (self.steps, self.reads, self.writes, self.dying, self.freed, live):
            order.insert(best_q, order.pop(p))  # after the step that was at best_q
        self._suffix_peaks()
        return 1
