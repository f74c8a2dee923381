"""New values of mutated inputs written into the inputs themselves, by the kernel that computes them.

Functionalization turns an in-place write to a graph input (an optimizer's `param.add_`, its state's
`exp_avg.lerp_`, a grad accumulated in place) into an extra graph output, which the runtime copies into
the real input after the call (`kiln.autograd.runtime.MutationWriter`): a buffer allocated, written, and
copied once more per mutated input and call. Where the kernel computing the new value can store it into
the input directly, the output buffer is renamed to the input: the kernel takes the input as a buffer it
reads and writes (one pointer, as ATen's own in-place kernels do), the wrapper allocates nothing for it
and returns the input itself, and the runtime, finding its output to be the input, copies nothing.

The store replaces the input's old value, so it is done only where nothing can read that value after it:

- the new value `B` is computed by a pointwise kernel (no template), or by the epilogue of a reduction kernel
  (a batch norm's running statistics, computed from its batch statistics), with the input's exact layout and
  dtype, and is returned once, as that input's new value, not as a view;
- no step after that kernel reads the input, and no extern views it (a view read later would see the new
  value) or the new value (its view would become the input's); the input is not itself returned (a
  forward graph returns inputs it saves for the backward);
- inside the kernel, every read of the input loads the element being written (the same index, unmasked,
  not a gather) and comes no later than the store: each element is read, then overwritten, by the same
  loop iteration, so neither threads nor vectors see another iteration's write. Reads of the new value
  later in the kernel take it from the register the store wrote; the kernel printer reuses nothing it
  computed from the old value after the store (`KernelGroup.writes_inputs`, kiln/codegen/cse.py).

The wrapper moves the written inputs' version counters before its first kernel, as eager's in-place ops
move them when they write: a graph that raises after the write (a division by zero in a later kernel)
leaves them moved, so the frame's eager re-run (kiln/capture/rerun.py) first restores the inputs from the
copy it took, rather than writing them twice.

Targets whose runtime re-runs kernels on the call's own arguments (the autotuner benchmarks candidates on
them) or records them (CUDA graphs) are not given this rewrite (`applies`).
"""
from __future__ import annotations

import dataclasses

import sympy

from kiln.lower import ir
from kiln.schedule import deps
from kiln.schedule.fusion import ExternStep, KernelGroup, Schedule


def write_into_inputs(sched: Schedule, writes: tuple[tuple[int, int], ...]) -> dict[str, str]:
    """Rename each new-value output of `writes` ((graph output index, graph input index) pairs) that may be
    stored into its input (module docstring) to that input; returns {output buffer: input buffer}."""
    graph = sched.graph
    renamed: dict[str, str] = {}
    for output_index, input_index in writes:
        target = graph.inputs[input_index]
        out = graph.outputs[output_index]
        if not isinstance(target, ir.InputBuffer) or not isinstance(out, ir.TensorRef) or out.view:
            continue
        group = _writable(sched, out.buf, target)
        if group is not None:
            _rename(sched, out.buf, target.name)
            group.writes_inputs.add(target.name)
            renamed[out.buf] = target.name
    return renamed


def _writable(sched: Schedule, buf: str, target: ir.InputBuffer) -> KernelGroup | None:
    """The kernel that may store `buf` into `target` (module docstring), or None."""
    graph = sched.graph
    outputs = [o.buf for o in graph.outputs if isinstance(o, ir.TensorRef)]
    if outputs.count(buf) != 1 or target.name in outputs or buf in graph.zero_padded:
        return None
    found = _writer(sched, buf)
    if found is None:
        return None
    k, group, node = found
    if not _same_layout(node.layout, target.layout):
        return None
    for j, step in enumerate(sched.steps):
        if isinstance(step, ExternStep):
            reads = _extern_reads(step)
            if target.name in reads and (j > k or getattr(step.node, "aliases_inputs", False)):
                return None
            if buf in reads and getattr(step.node, "aliases_inputs", False):  # a view of the new value would
                return None  # become a view of the input, where eager's is a tensor of its own
        elif j > k and target.name in _group_reads(step):
            return None
    return group if _reads_in_place(group, node, target.name) else None


def _writer(sched: Schedule, buf: str) -> tuple[int, KernelGroup, ir.ComputedBuffer] | None:
    """(step index, group, node) of the kernel that computes `buf` where it may store it into an input: a
    pointwise kernel, or a reduction kernel whose epilogue computes it (module docstring), if one does."""
    for k, step in enumerate(sched.steps):
        if not isinstance(step, KernelGroup):
            continue
        for node in step.nodes:
            if node.name == buf:
                usable = (sched.template_of(step) is None and buf not in step.local
                          and (not step.has_reduction() or _in_epilogue(step, node)))
                return (k, step, node) if usable else None
    return None


def _in_epilogue(group: KernelGroup, node: ir.ComputedBuffer) -> bool:
    """Whether `node` is a pointwise node of a reduction kernel's outer segment (no reduced loop): stored once per
    output row after the loops that reduce it, so every read of the row's own element in the loops (and every
    partial kernel of a split reduction) comes before its store. A node of the loops themselves is not: a two-pass
    reduction reads its loop's values a second time."""
    return not node.is_reduction() and any(not seg.inner and node in seg.nodes for seg in group.segments)


def _same_layout(a: ir.Layout, b: ir.Layout) -> bool:
    return (a.dtype == b.dtype and sympy.sympify(a.offset) == 0 and sympy.sympify(b.offset) == 0
            and tuple(a.size) == tuple(b.size) and tuple(a.stride) == tuple(b.stride))


def _extern_reads(step: ExternStep) -> set[str]:
    node = step.node
    return deps.reads(node) if isinstance(node, (ir.Extern, ir.MultiOutput)) else set()


def _group_reads(group: KernelGroup) -> set[str]:
    return {b for n in group.nodes for b in deps.reads(n)}


def _reads_in_place(group: KernelGroup, writer: ir.ComputedBuffer, name: str) -> bool:
    """Whether every read of `name` in the group loads the element `writer` stores, no later than it."""
    store = group.store_index(writer)
    position = next(i for i, n in enumerate(group.nodes) if n is writer)
    for i, node in enumerate(group.nodes):
        loads = [ld for ld in deps.body_loads(node) if ld.buf == name]
        if not loads:
            continue
        if i > position:
            return False
        mapping = group.var_map(node)
        for ld in loads:
            if ld.mask is not None or ld.indirect or group.mapped_index(ld.index, mapping) != store:
                return False
    return True


def _rename(sched: Schedule, old: str, new: str) -> None:
    """`old` becomes `new` everywhere the schedule names it: the node, the loads of it, the externs' and the
    templates' operands, the graph's outputs."""
    graph = sched.graph
    for node in graph.nodes:
        if isinstance(node, ir.ComputedBuffer):
            if node.name == old:
                node.name = new
            node.data.body = ir.rename_loads(node.data.body, {old: new})
        elif isinstance(node, ir.Extern):
            node.args, node.kwargs = ir.rename_refs((node.args, node.kwargs), {old: new})
        elif isinstance(node, ir.MultiOutput) and node.source == old:
            node.source = new
    graph.outputs = [ir.TensorRef(new, o.layout, o.view) if isinstance(o, ir.TensorRef) and o.buf == old else o
                     for o in graph.outputs]
    for name, spec in sched.templates.items():  # a template's operands, named in its spec (a matmul's A and B)
        operands = {f.name: ir.rename_refs(getattr(spec, f.name), {old: new}) for f in dataclasses.fields(spec)
                    if isinstance(getattr(spec, f.name), ir.TensorRef)}
        sched.templates[name] = dataclasses.replace(spec, **operands)
    if old in graph.origins:
        graph.origins[new] = graph.origins.pop(old)
    for group in sched.kernels():
        if old in group.orders:
            group.orders[new] = group.orders.pop(old)
