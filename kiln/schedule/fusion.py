"""Fusion: group IR nodes into kernels.

A kernel (`KernelGroup`) is an outer loop nest over `outer` sizes (run in
parallel) whose body is a sequence of *segments*: an inner segment loops over
the `inner` sizes (pointwise nodes of shape outer+inner, and reductions of
shape outer reducing inner), an outer segment computes nodes of shape `outer`
once per outer iteration. Size-1 dims are ignored when matching shapes.

Rules:
- vertical: a consumer joins its producer's kernel when both iterate the same
  space and it reads each in-kernel producer at exactly the point being written
  (so the value is ready in the same iteration, no cross-thread dependence);
- horizontal: any node joins the latest compatible kernel after all its producers,
  so siblings reading the same inputs share a kernel;
- prologues/epilogues: pointwise nodes of shape outer+inner fuse before and after
  reductions; a pure pointwise kernel is re-split into outer/inner when the
  first reduction joins it;
- a reduction over a pointwise kernel's leading dims (a bias gradient, the
  column sum of relu's backward) takes that kernel over: its loops become the
  reduction's, and the pointwise nodes run their dims in that order (`orders`),
  so the values are summed where they are computed, not stored and read back;
- a reduction is computed once; reductions with the same body, ranges and
  welford family share one loop (mean and m2 of one welford);
- an inner segment that reads no reduction result and nothing of the segments
  between runs in an earlier inner segment's loop (`merge_independent_segments`):
  sibling reductions over values one loop computes (batch norm's backward sums
  of a residual block's two branches) share that loop, and a group left as one
  inner segment and its epilogue can split its reduction across programs;
- externs (and their tuple items) are their own steps and order barriers only
  for their consumers;
- templates (max-autotune's matmuls, given as reduction nodes by the Triton
  target, `schedule(graph, templates=...)`) each start a kernel of their own and
  take only epilogues: pointwise nodes over the template's output space that
  read a buffer of the kernel (bias, activation, residual), in outer segments;
  none with `epilogue_fusion=False`.

The plan is target independent: the C++ and Triton code generators both take
`Schedule` and emit one kernel per group.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

import sympy

from kiln.lower import ir
from kiln.lower.index import index_vars, linear_index, simplify_in_ranges
from kiln.schedule import deps


def nonunit(sizes) -> tuple:
    return tuple(s for s in sizes if s != 1)


@dataclass
class Segment:
    inner: bool
    nodes: list = field(default_factory=list)

    def has_reduction(self) -> bool:
        return any(n.is_reduction() for n in self.nodes)


@dataclass
class KernelGroup:
    name: str
    outer: tuple
    inner: tuple
    segments: list = field(default_factory=list)
    local: set = field(default_factory=set)  # buffers kept in registers, never stored
    # node name -> the loop position of each of its non-unit dims, for pointwise nodes whose dims the
    # loops run in another order (the producer of a column sum: [rows, cols] on loops (cols | rows))
    orders: dict = field(default_factory=dict)
    # graph inputs the kernel stores new values into, having read them (kiln/schedule/input_writes.py)
    writes_inputs: set = field(default_factory=set)

    @property
    def nodes(self) -> list:
        return [n for s in self.segments for n in s.nodes]

    def has_reduction(self) -> bool:
        return any(s.has_reduction() for s in self.segments)

    def outer_vars(self):
        return index_vars("x", len(self.outer))

    def inner_vars(self):
        return index_vars("y", len(self.inner))

    def var_map(self, node: ir.ComputedBuffer) -> dict:
        """Node index symbols (i*, r*) -> this kernel's loop variables (x* outer, y* inner).

        A pointwise node whose dims merge runs of the kernel's loops (a [384, 128, 128] view of a
        [32, 12, 128 | 128] reduction kernel) maps each dim to its run's row-major index."""
        loop = list(self.outer_vars()) + list(self.inner_vars())
        sizes = list(self.outer) + list(self.inner)
        mapping, k = {}, 0
        d = node.data
        runs = None if isinstance(d, ir.Reduction) else merged_runs(nonunit(d.ranges), self.outer, self.inner)
        order = self.orders.get(node.name)
        for j, s in enumerate(d.ranges):
            if s == 1:
                mapping[index_vars("i", j + 1)[j]] = sympy.Integer(0)
            elif order is not None:
                mapping[index_vars("i", j + 1)[j]] = loop[order[k]]
                k += 1
            elif runs is not None:
                expr = sympy.Integer(0)
                for p in runs[k]:
                    expr = expr * sizes[p] + loop[p]
                mapping[index_vars("i", j + 1)[j]] = expr
                k += 1
            else:
                mapping[index_vars("i", j + 1)[j]] = loop[k]
                k += 1
        if isinstance(d, ir.Reduction):
            k = len(self.outer)
            for j, s in enumerate(d.reduction_ranges):
                mapping[index_vars("r", j + 1)[j]] = loop[k] if s != 1 else sympy.Integer(0)
                k += s != 1
        return mapping

    def loop_ranges(self) -> tuple:
        """(loop variable, size) of each of the kernel's loops."""
        return tuple(zip((*self.outer_vars(), *self.inner_vars()), (*self.outer, *self.inner)))

    def mapped_index(self, index, mapping: dict) -> sympy.Expr:
        """A node's load `index` over this kernel's loops (`mapping`: its `var_map`), with the divisions and
        remainders the loops' bounds decide folded (`simplify_in_ranges`): where the node's dims merge runs of
        loops, it reads an in-kernel producer at the point written only once they are."""
        return simplify_in_ranges(sympy.expand(sympy.sympify(index).xreplace(mapping)), self.loop_ranges())

    def mapped_body(self, node: ir.ComputedBuffer) -> ir.Expr:
        """`node`'s body over this kernel's loops, its indices as `mapped_index` gives them."""
        body = ir.subs_expr(node.data.body, self.var_map(node))
        ranges = self.loop_ranges()
        return ir.map_indices(body, lambda index: simplify_in_ranges(index, ranges))

    def store_index(self, node: ir.ComputedBuffer) -> sympy.Expr:
        idx = index_vars("i", len(node.layout.size))
        return sympy.expand(linear_index(idx, node.layout.stride, node.layout.offset).xreplace(self.var_map(node)))

    def size_symbols(self) -> set:
        """The symbolic sizes this group's kernel needs as arguments: every free symbol of its
        loop bounds, loads, masks and layouts that is not a loop variable (i0, r1, x2, y3) or an
        indirect-load index (ind0). Both targets pass exactly these to their kernels."""
        syms = set()
        for s in list(self.outer) + list(self.inner):
            syms |= sympy.sympify(s).free_symbols
        for n in self.nodes:
            syms |= ir.index_symbols(n.data.body)
            for s in n.layout.stride:
                syms |= sympy.sympify(s).free_symbols
            syms |= sympy.sympify(n.layout.offset).free_symbols
        return {s for s in syms if not _is_loop_or_indirect(s)}

    def segment_of(self, name: str):
        for k, s in enumerate(self.segments):
            for n in s.nodes:
                if n.name == name:
                    return k, n
        return None

    def __str__(self) -> str:
        outer, inner = ", ".join(map(str, self.outer)), ", ".join(map(str, self.inner))
        lines = [f"kernel {self.name}: outer=({outer}) inner=({inner})"]
        for k, s in enumerate(self.segments):
            lines.append(f"  segment {k} ({'inner' if s.inner else 'outer'}): " + ", ".join(
                n.name + ("(local)" if n.name in self.local else "")
                + (f"(dims on loops {', '.join(map(str, self.orders[n.name]))})" if n.name in self.orders else "")
                for n in s.nodes))
        return "\n".join(lines)


@dataclass
class ExternStep:
    node: ir.Node

    def __str__(self) -> str:
        return f"extern {self.node.name}"


@dataclass
class Schedule:
    graph: ir.LoweredGraph
    steps: list
    templates: dict = field(default_factory=dict)  # node name -> spec of the template computing it (matmuls)

    def template_of(self, group: KernelGroup):
        """The template spec of a group that starts with a template node, else None."""
        nodes = group.nodes
        return self.templates.get(nodes[0].name) if nodes else None

    def kernels(self) -> list[KernelGroup]:
        return [s for s in self.steps if isinstance(s, KernelGroup)]

    def __str__(self) -> str:
        return "\n".join(str(s) for s in self.steps)


def _is_loop_or_indirect(sym) -> bool:
    name = sym.name
    return (name[0] in "irxy" and name[1:].isdigit()) or (name.startswith("ind") and name[3:].isdigit())


def _shape(node: ir.ComputedBuffer):
    d = node.data
    if isinstance(d, ir.Reduction):
        return nonunit(d.ranges), nonunit(d.reduction_ranges)
    return nonunit(d.ranges), ()


def _epilogue_ok(group: KernelGroup, node: ir.ComputedBuffer, shape: tuple) -> bool:
    """A template group takes `node` (of `_shape` `shape`) as an epilogue: pointwise over its output space, reading
    one of its buffers."""
    if node.is_reduction() or shape[0] != group.outer:  # asked of every template a node passes: cheap first
        return False
    reads = deps.reads(node)
    return any(n.name in reads for s in group.segments for n in s.nodes)


def try_add(group: KernelGroup, node: ir.ComputedBuffer, shape: tuple | None = None) -> bool:
    """Add `node` (of `_shape` `shape`, computed once per node by the scheduler; computed here when not given)
    to `group` if the fusion rules allow it; returns whether it was added.

    Called for every candidate kernel of every node (tens of thousands of times on a big
    training graph, mostly to say no): the loop space is checked first, without copying
    the group, and the group is changed only once `node` is accepted."""
    fit = _loop_fit(group, node, shape if shape is not None else _shape(node))
    if fit is None:
        return False
    # the group's loops as they would be
    trial = KernelGroup(group.name, fit.outer, fit.inner, group.segments, orders=fit.orders)
    # every in-kernel producer must be read exactly at the point it writes
    last = group.segments[-1] if group.segments else None
    same_segment_ok = last is not None and (fit.resplit or last.inner) == fit.in_inner
    vm = trial.var_map(node)
    for ld in deps.body_loads(node):
        found = trial.segment_of(ld.buf)
        if found is None:
            continue
        k, producer = found
        if trial.mapped_index(ld.index, vm) != trial.store_index(producer):
            return False
        if k == len(group.segments) - 1 and producer.is_reduction():
            same_segment_ok = False
    group.outer, group.inner, group.orders = fit.outer, fit.inner, fit.orders
    if fit.resplit:
        for s in group.segments:
            s.inner = True
    if same_segment_ok:
        last.nodes.append(node)
    else:
        group.segments.append(Segment(fit.in_inner, [node]))
    return True


class LoopFit(NamedTuple):
    """How a group's loops take one more node (see `_loop_fit`)."""

    outer: tuple  # the group's outer loops after
    inner: tuple  # its inner (reduction) loops after
    in_inner: bool  # whether the node goes in an inner segment
    resplit: bool  # whether the group is re-split into outer/inner around a first reduction
    orders: dict  # the group's `orders` after


def _loop_fit(group: KernelGroup, node: ir.ComputedBuffer, shape: tuple) -> LoopFit | None:
    """How `group`'s loops take `node` (of `_shape` `shape`), or None when they cannot."""
    o, i = shape
    orders = group.orders
    if node.is_reduction():
        if group.has_reduction() or group.inner:
            return LoopFit(o, i, True, False, orders) if (o, i) == (group.outer, group.inner) else None
        if o == group.outer:
            return LoopFit(o, i, True, False, orders)
        reordered = _reordered(group, node, o, i)
        return None if reordered is None else LoopFit(o, i, True, True, reordered)
    if o == group.outer:
        return LoopFit(group.outer, group.inner, False, False, orders)
    if group.inner and o == group.outer + group.inner:
        return LoopFit(group.outer, group.inner, True, False, orders)
    runs = merged_runs(o, group.outer, group.inner)
    if runs is not None:
        return LoopFit(group.outer, group.inner, runs[-1][-1] >= len(group.outer), False, orders)
    return None


def _reordered(group: KernelGroup, reduction: ir.ComputedBuffer, outer: tuple, inner: tuple) -> dict | None:
    """The `orders` under which `reduction` (over `outer`, reducing `inner`) takes over a pointwise
    group whose loops are the same sizes, maybe in another order: none ({}) when the group's dims run
    on the new loops as they are, else the dim order under which the reduction reads each of the
    group's buffers where it is written. None when no order does, or when a reordered group's nodes
    do not all run on its loops one dim each."""
    loops = outer + inner
    if loops == group.outer and all(_runs_on(n, outer, inner) for n in group.nodes) \
            and _reads_where_written(KernelGroup(group.name, outer, inner, group.segments), reduction):
        return {}
    if group.orders or len(loops) != len(group.outer) or sorted(map(str, loops)) != sorted(map(str, group.outer)):
        return None
    if any(nonunit(n.data.ranges) != group.outer for n in group.nodes):
        return None
    for order in itertools.permutations(range(len(loops))):
        if order != tuple(range(len(loops))) and all(loops[p] == size for p, size in zip(order, group.outer)):
            trial = KernelGroup(group.name, outer, inner, group.segments, orders={n.name: order for n in group.nodes})
            if _reads_where_written(trial, reduction):
                return trial.orders
    return None


def _runs_on(node: ir.ComputedBuffer, outer: tuple, inner: tuple) -> bool:
    """Do pointwise `node`'s dims run on the loops `outer | inner`: one dim per loop, or dims merging runs of loops
    (`merged_runs`)? A [9] view of a [3, 3] group's value merges both loops, and once a reduction splits them into
    (3 | 3) no dim may cross from the outer loops into the inner one: it ran on the outer loop alone and left
    six of its nine elements unwritten."""
    sizes = nonunit(node.data.ranges)
    return sizes == outer + inner or merged_runs(sizes, outer, inner) is not None


def _reads_where_written(trial: KernelGroup, reduction: ir.ComputedBuffer) -> bool:
    """Does `reduction`, in `trial`'s loops, read each of the group's buffers at the point it is written?"""
    vm = trial.var_map(reduction)
    for ld in deps.body_loads(reduction):
        found = trial.segment_of(ld.buf)
        if found is not None and trial.mapped_index(ld.index, vm) != trial.store_index(found[1]):
            return False
    return True


def merged_runs(sizes: tuple, outer: tuple, inner: tuple) -> tuple | None:
    """For pointwise `sizes` that differ from a kernel's loops only by merged dims: the loop
    positions each dim spans (consecutive, not crossing from outer into inner), else None.

    Against the outer loops alone (a node of an outer segment) or outer + inner (an inner
    segment). Only static sizes: a symbolic product cannot be compared. Asked for every
    candidate kernel of every node, mostly with shapes asked before: answered once per shape."""
    return _merged_runs(tuple(sizes), tuple(outer), tuple(inner))


@functools.lru_cache(maxsize=8192)
def _merged_runs(sizes: tuple, outer: tuple, inner: tuple) -> tuple | None:
    if sizes in (outer, outer + inner):
        return None  # the plain one-dim-per-loop mapping
    if not all(isinstance(x, (int, sympy.Integer)) for x in (*sizes, *outer, *inner)):
        return None
    for loops in (tuple(outer), tuple(outer) + tuple(inner)):
        runs, pos = [], 0
        for n in sizes:
            run, span = [], 1
            while span < n and pos < len(loops):
                if run and pos == len(outer):
                    return None  # a dim would span outer and inner loops
                span *= int(loops[pos])
                run.append(pos)
                pos += 1
            if span != n or not run:
                break
            runs.append(tuple(run))
        else:
            if pos == len(loops):
                return tuple(runs)
    return None


def schedule(graph: ir.LoweredGraph, templates: dict | None = None, *, epilogue_fusion: bool) -> Schedule:
    """Order the graph's nodes into kernels and extern calls, then mark register-only buffers.

    `templates`: node name -> template spec (see the module docstring); `epilogue_fusion` (the option):
    whether pointwise nodes after a template join its kernel."""
    templates = templates or {}
    template_groups: set[int] = set()
    steps: list = []
    kernels = 0  # kernel groups in `steps`, which name the next one
    where: dict[str, int] = {}
    for inp in graph.inputs:
        where[inp.name] = -1
    dead = unread_buffers(graph)
    for node in graph.nodes:
        if node.name in dead:
            continue
        if not isinstance(node, ir.ComputedBuffer):
            steps.append(ExternStep(node))
            where[node.name] = len(steps) - 1
            continue
        producers = {where.get(b, -1) for b in deps.reads(node)}
        shape = _shape(node)
        placed = None if node.name in templates else next(  # a template starts a kernel of its own
            (k for k in _candidates(steps, producers) if (k not in template_groups or (
                epilogue_fusion and _epilogue_ok(steps[k], node, shape))) and try_add(steps[k], node, shape)), None)
        if placed is None:
            o, i = shape
            steps.append(KernelGroup(f"kernel{kernels}", o, i, [Segment(bool(i), [node])]))
            kernels += 1
            placed = len(steps) - 1
            if node.name in templates:
                template_groups.add(placed)
        where[node.name] = placed
    sched = Schedule(graph, steps, dict(templates))
    for group in sched.kernels():
        merge_independent_segments(group)
    _mark_local(sched)
    return sched


def unread_buffers(graph: ir.LoweredGraph) -> set[str]:
    """Computed buffers whose values reach nothing: no node reads them, directly or through other such buffers,
    and the graph returns none of them. A lowering may leave one behind: `copy(slice, src)` reads only the
    slice's geometry, so the slice's values, computed as a buffer, are read by no one. Scheduled, such a buffer
    became a kernel that stores nothing and still ran on every call. A buffer that checks for values eager raises
    on stays."""
    outputs = deps.output_buffers(graph)
    readers = {name: len(nodes) for name, nodes in deps.readers(graph).items()}
    dead: set[str] = set()
    for node in reversed(graph.nodes):
        if isinstance(node, ir.ComputedBuffer) and node.name not in outputs and not readers.get(node.name) \
                and not ir.finds_invalid_values(node.data.body):
            dead.add(node.name)
            for b in deps.reads(node):
                readers[b] = readers.get(b, 0) - 1
    return dead


def merge_independent_segments(group: KernelGroup) -> None:
    """Move each inner segment of `group` into the earliest inner segment before it whose loop can compute it, then
    join outer segments left next to each other.

    A node that starts an inner segment after an outer one (a second reduction after the first one's epilogue)
    gets a loop of its own even when it reads nothing that loop must wait for. Read again, the kernel walks the
    same rows twice; split (kiln/codegen/triton/split.py), it cannot be, being more than one inner segment and
    its epilogue: a looped kernel with one program per few columns walked every row of a batch norm's input.
    Segments keep the order of the nodes (each node joins the last segment or a new one), so nothing before
    segment j reads it; it may move into inner segment i when it reads, of segments i..j-1, only values segment
    i computes at the point being written (not its reductions, which are whole only after its loop)."""
    segments = group.segments
    j = 1
    while j < len(segments):
        home = _earliest_loop(segments, j) if segments[j].inner else None
        if home is None:
            j += 1
            continue
        segments[home].nodes.extend(segments.pop(j).nodes)
    joined: list[Segment] = []
    for seg in segments:
        if joined and not seg.inner and not joined[-1].inner:
            joined[-1].nodes.extend(seg.nodes)
        else:
            joined.append(seg)
    group.segments = joined


def _earliest_loop(segments: list, j: int) -> int | None:
    """The earliest inner segment before `segments[j]` whose loop may compute it (see
    `merge_independent_segments`), or None."""
    read = set().union(*(deps.reads(n) for n in segments[j].nodes))
    home = None
    for i in range(j - 1, -1, -1):
        seg = segments[i]
        written = [n for n in seg.nodes if n.name in read]
        if written and (not seg.inner or any(n.is_reduction() for n in written)):
            break  # a value complete only after segment i: segment j stays after it
        if seg.inner:
            home = i
        if written:
            break  # read where segment i writes it: no earlier loop has it
    return home


def _candidates(steps: list, producers: set):
    """The kernels a node may join, in the order they are tried: its last producer's kernel (vertical fusion),
    then every other kernel after that producer (horizontal), latest first. Lazily: the first kernel that takes
    the node ends the walk (a list of every candidate, filtered whole, cost each node the length of the graph)."""
    last = max(producers, default=-1)
    if last >= 0 and isinstance(steps[last], KernelGroup):
        yield last
    for k in range(len(steps) - 1, max(last, 0) - 1, -1):
        if k != last and isinstance(steps[k], KernelGroup):
            yield k


def _mark_local(sched: Schedule) -> None:
    """A buffer read only inside its own kernel, where its value is still in a register, is never stored."""
    graph = sched.graph
    outputs = deps.output_buffers(graph)
    readers = deps.readers(graph)
    for group in sched.kernels():
        segment_of = {n.name: k for k, seg in enumerate(group.segments) for n in seg.nodes}
        for k, seg in enumerate(group.segments):
            for n in seg.nodes:
                if n.name in outputs:
                    continue
                ok = True
                for r in readers.get(n.name, []):
                    found = segment_of.get(r.name) if isinstance(r, ir.ComputedBuffer) else None
                    if found is None or (seg.inner and not n.is_reduction() and found != k):
                        ok = False
                        break
                if ok:
                    group.local.add(n.name)
