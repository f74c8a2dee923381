"""The wrapper: the generated Python host program that runs one compiled graph.

It binds the size symbols from the inputs, allocates each kernel output with
`torch.empty_strided` (or in the storage of a dead buffer, per the memory plan),
calls the kernels and the extern ATen ops in schedule order, drops each buffer
after its last use, and returns the graph's outputs. It is plain Python source
(written to the debug directory with trace.enabled) compiled with `exec`.
Target independent: a kernel call is `name(*pointers, *sizes)` for whatever
launcher the target binds to `name`.
"""
from __future__ import annotations

import math

import torch

from kiln.codegen.index_printer import pyexpr
from kiln.lower import ir
from kiln.schedule.fusion import ExternStep, KernelGroup, Schedule
from kiln.schedule.memory import MemoryPlan


def _restride(t: torch.Tensor, size, stride) -> torch.Tensor:
    """`t` with exactly `stride` on its non-trivial dims (copied if ATen chose another layout)."""
    if all(n <= 1 or a == b for n, a, b in zip(size, t.stride(), stride)):
        return t
    out = torch.empty_strided(size, stride, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _view(t: torch.Tensor, size, stride, offset) -> torch.Tensor:
    return t.as_strided(size, stride, t.storage_offset() + offset)


class WrapperCodegen:
    def __init__(self, sched: Schedule, plan: MemoryPlan, kernels: dict, device: str = "cpu"):
        self.sched, self.plan, self.kernels, self.device = sched, plan, kernels, device
        self.graph = sched.graph
        self.layouts = self.graph.buffer_layouts()
        self.namespace: dict = {"torch": torch, "aten": torch.ops.aten, "empty_strided": torch.empty_strided,
                                "_restride": _restride, "_view": _view, "device": torch.device}
        self.lines: list[str] = []

    # -- values as Python source
    def const(self, value) -> str:
        if value is None or isinstance(value, (bool, int, str)):
            return repr(value)
        if isinstance(value, float):
            return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
        if isinstance(value, (list, tuple)):
            inner = ", ".join(self.arg(v) for v in value)
            return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
        if isinstance(value, torch.dtype):
            return str(value)
        name = f"_c{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def arg(self, a) -> str:
        if isinstance(a, ir.TensorRef):
            if not a.view:
                return a.buf
            lay = a.layout
            return f"_view({a.buf}, {self.shape(lay.size)}, {self.shape(lay.stride)}, {pyexpr(lay.offset)})"
        if isinstance(a, ir.SymRef):
            return pyexpr(a.expr)
        return self.const(a)

    def shape(self, xs) -> str:
        inner = ", ".join(pyexpr(x) for x in xs)
        return f"({inner}{',' if len(xs) == 1 else ''})"

    def op_name(self, op) -> str:
        if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten":
            return f"aten.{op._schema.name.split('::')[1]}.{op._overloadname}"
        return self.const(op)

    # -- the program
    def generate(self) -> str:
        g = self.graph
        names = [i.name for i in g.inputs]
        self.line = lambda s: self.lines.append("    " + s)
        self.lines.append("def call(" + ", ".join(names) + "):")
        for sym, source in g.size_vars.items():
            self.line(f"{sym} = {source}")
        kernel_reads = set()
        for k in self.kernels.values():
            kernel_reads |= set(k.arg_names)
        for inp in g.inputs:
            if isinstance(inp, ir.InputBuffer) and inp.name in kernel_reads:
                self.restride(inp.name, inp.name, inp.layout)
        for name in g.constants:
            self.namespace[name] = g.constants[name]
        for k, step in enumerate(self.sched.steps):
            if isinstance(step, KernelGroup):
                self.kernel_call(step)
            else:
                self.extern_call(step)
            dead = self.plan.release_after.get(k, [])
            if dead:
                self.line("del " + ", ".join(dead))
        self.line("return (" + "".join(self.arg(o) + ", " for o in g.outputs) + ")")
        return "\n".join(self.lines) + "\n"

    def restride(self, dst: str, src: str, layout: ir.Layout) -> None:
        """Make `src` have `layout`'s strides (a cheap tuple compare per call; a copy only if ATen differed)."""
        stride = self.shape(layout.stride)
        self.line(f"if {src}.stride() != {stride}: {dst} = _restride({src}, {self.shape(layout.size)}, {stride})")

    def kernel_call(self, group: KernelGroup) -> None:
        kernel = self.kernels[group.name]
        for b in kernel.outputs:
            lay = self.layouts[b]
            old = self.plan.reuse.get(b)
            if old is not None:
                self.line(f"{b} = {old}.as_strided({self.shape(lay.size)}, {self.shape(lay.stride)}); del {old}  # reuse")
            else:
                self.line(f"{b} = empty_strided({self.shape(lay.size)}, {self.shape(lay.stride)}, "
                          f"dtype={lay.dtype}, device={self.device!r})")
        # C++ kernels take raw pointers; Triton launchers take the tensors (`takes_tensors`)
        ptr = "{}" if getattr(kernel, "takes_tensors", False) else "{}.data_ptr()"
        args = [ptr.format(b) for b in kernel.arg_names] + [pyexpr(s) for s in kernel.size_args]
        self.line(f"{group.name}({', '.join(args)})")

    def extern_call(self, step: ExternStep) -> None:
        n = step.node
        if isinstance(n, ir.MultiOutput):
            self.line(f"{n.name} = {n.source}[{n.index}]")
            self.restride(n.name, n.name, n.layout)
            return
        args = [self.arg(a) for a in n.args] + [f"{k}={self.arg(v)}" for k, v in n.kwargs.items()]
        self.line(f"{n.name} = {self.op_name(n.op)}({', '.join(args)})")
        if isinstance(n.layout, ir.Layout):
            self.restride(n.name, n.name, n.layout)


def generate_wrapper(sched: Schedule, plan: MemoryPlan, kernels: dict, device: str = "cpu") -> tuple[str, dict]:
    """(source of `call`, the namespace it runs in, minus the kernel launchers)."""
    w = WrapperCodegen(sched, plan, kernels, device)
    return w.generate(), w.namespace
