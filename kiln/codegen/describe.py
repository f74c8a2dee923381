"""Names and pictures of a schedule: kernels named by what they fuse, the fused graph as plain data.

`name_kernels(sched)` renames each kernel group after the work it does, in body
order: reductions by their type, elementwise ops by their IR op name, matmul
templates as `mm`/`bmm`, at most four distinct names, then the kernel's index
(`fused_max_sub_exp_sum_1`, `fused_mm_erf_2`). Both
targets (C++, Triton) emit the name as the function's name, so it is what the
wrapper calls, what the kernel source shows and what a profiler lists.

`fused_graph(sched)` is the scheduled graph as data (nodes, edges, one cluster
per kernel) for the debug package's diagrams; it holds names and labels only.
`FusedGraph(sched)` is the same, computed when first read.
"""
from __future__ import annotations

from collections.abc import Mapping

from kiln.lower import ir
from kiln.schedule import deps
from kiln.schedule.fusion import ExternStep, KernelGroup, Schedule

# Ops too common to say what a kernel does; named only when nothing else is.
_PLAIN = {"cast", "where", "add", "mul", "sub", "truediv", "neg"}
_MAX_PARTS = 4


def _ops(expr, out: list) -> None:
    if isinstance(expr, ir.Op):
        for a in expr.args:
            _ops(a, out)
        out.append(expr.name)


def kernel_parts(group: KernelGroup, template: str | None = None) -> list[str]:
    """The distinct op names of `group`'s nodes, in order (reductions by their type); a template group's first
    node (a matmul written as a sum of products) is named by `template` ("mm", "bmm")."""
    names: list[str] = [template] if template else []
    for node in group.nodes[1:] if template else group.nodes:
        ops: list[str] = []
        _ops(node.data.body, ops)
        if node.is_reduction():
            ops.append(node.data.reduction_type.replace("welford_m2", "welford").replace("welford_mean", "welford"))
        for op in ops:
            if op not in names:
                names.append(op)
    telling = [n for n in names if n not in _PLAIN]
    return (telling or names)[:_MAX_PARTS]


def name_kernels(sched: Schedule) -> None:
    """Rename every kernel group of `sched` after what it fuses (a C identifier, unique by its index)."""
    for i, group in enumerate(sched.kernels()):
        spec = sched.template_of(group)
        parts = kernel_parts(group, spec.op if spec is not None else None) or ["copy"]
        group.name = "_".join(["fused" if len(group.nodes) > 1 else "kernel", *parts, str(i)])


def fused_graph(sched: Schedule) -> dict:
    """{"nodes": [(name, label, cluster or None)], "edges": [(src, dst)], "clusters": {name: label}}."""
    nodes, edges, clusters = [], [], {}
    graph = sched.graph
    for b in graph.inputs:
        nodes.append((b.name, f"{b.name}: {b.layout}" if isinstance(b, ir.InputBuffer) else b.name, None))
    for name, value in graph.constants.items():
        nodes.append((name, f"{name}: {tuple(value.shape)}", None))
    known = {n[0] for n in nodes}
    for step in sched.steps:
        if isinstance(step, KernelGroup):
            clusters[step.name] = f"{step.name} ({len(step.nodes)} nodes)"
            members = [(n, step.name) for n in step.nodes]
        else:
            members = [(step.node, None)]
        for node, cluster in members:
            if isinstance(node, ir.ComputedBuffer):
                ops: list[str] = []
                _ops(node.data.body, ops)
                body = " ".join(dict.fromkeys(ops)) or "load"
                kind = f"reduce_{node.data.reduction_type}({body})" if node.is_reduction() else body
            elif isinstance(node, ir.Extern):
                kind = f"extern {node.op}"
            else:
                kind = type(node).__name__
            nodes.append((node.name, f"{node.name}: {kind}", cluster))
            known.add(node.name)
            edges += [(src, node.name) for src in sorted(deps.reads(node)) if src in known]
    for k, out in enumerate(graph.outputs):
        if isinstance(out, ir.TensorRef) and out.buf in known:
            nodes.append((f"output{k}", f"output {k}", None))
            edges.append((out.buf, f"output{k}"))
    return {"nodes": nodes, "edges": edges, "clusters": clusters}


class FusedGraph(Mapping):
    """`fused_graph(sched)`, computed when first read: every compile keeps it as an artefact, only the debug
    package's diagrams read it, and it walks every node's reads (a noticeable part of a big graph's compile)."""

    def __init__(self, sched: Schedule):
        self._sched, self._data = sched, None

    def _computed(self) -> dict:
        if self._data is None:
            self._data = fused_graph(self._sched)
        return self._data

    def __getitem__(self, key: str):
        return self._computed()[key]

    def __iter__(self):
        return iter(self._computed())

    def __len__(self) -> int:
        return len(self._computed())


__all__ = ["name_kernels", "fused_graph", "FusedGraph", "kernel_parts", "ExternStep"]
