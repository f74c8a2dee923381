"""`kiln.explain(fn)(*args)`: what compiling `fn` produced, as data and as a readable report.

Runs `fn` once under a fresh kiln.compile with a recording eager backend and
collects every capture: the graphs, the graph breaks (reason, user file:line,
source line), ops per graph, guards and compile times.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.api import compile as kiln_compile
from kiln.api import context_of
from kiln.backends import resolve_backend


@dataclass
class RecordedBreak:
    """One graph break that happened: the id of its `BreakReason` (capture/breaks.py), what broke and where."""

    reason: str
    detail: str
    location: str
    source_line: str
    hint: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}\n    at {self.location}\n      {self.source_line}\n    hint: {self.hint}"


@dataclass
class ExplainOutput:
    graphs: list[torch.fx.GraphModule] = field(default_factory=list)
    graph_count: int = 0
    graph_break_count: int = 0
    break_reasons: list[RecordedBreak] = field(default_factory=list)
    # graphs ended on purpose, not breaks: `.backward()` handed to compiled autograd
    boundaries: list[RecordedBreak] = field(default_factory=list)
    ops_per_graph: list[list[str]] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)
    compile_times: list[float] = field(default_factory=list)
    out: Any = None

    def __str__(self) -> str:
        lines = [
            f"Graph count: {self.graph_count}",
            f"Graph break count: {self.graph_break_count}",
            f"Op count: {sum(len(ops) for ops in self.ops_per_graph)}",
            f"Compile time: {sum(self.compile_times) * 1000:.1f} ms over {len(self.compile_times)} captures",
            "",
            "Break reasons:",
        ]
        for i, b in enumerate(self.break_reasons, 1):
            lines.append(f"  {i}. {b}")
        if not self.break_reasons:
            lines.append("  (none)")
        if self.boundaries:
            lines += ["", "Boundaries (not breaks):"] + [f"  {i}. {b}" for i, b in enumerate(self.boundaries, 1)]
        lines.append("")
        for i, (gm, ops) in enumerate(zip(self.graphs, self.ops_per_graph), 1):
            lines.append(f"Graph {i}: {len(ops)} ops")
            lines += ["    " + line for line in gm.code.strip().splitlines()]
            lines.append("")
        lines.append("Guards:")
        lines += ["  " + g for g in self.guards]
        return "\n".join(lines)


def _ops(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target.__name__ if callable(n.target) else n.target) for n in gm.graph.nodes
            if n.op in ("call_function", "call_method", "call_module")]


def explain(fn: Callable, *extra_args, **extra_kwargs) -> Callable[..., ExplainOutput]:
    """`kiln.explain(fn)(*args, **kwargs)` -> ExplainOutput (also accepts explain(fn, *args) like torch's old form)."""

    def run(*args, **kwargs) -> ExplainOutput:
        # a backend object of its own, not the name "eager": the report is this call's captures, not those of
        # every kiln.compile naming "eager", which share theirs (as torch's explain hands dynamo its own backend)
        compiled = kiln_compile(fn, backend=functools.partial(resolve_backend("eager", None, None)))
        out = compiled(*args, **kwargs)
        report = ExplainOutput(out=out)
        for record in context_of(compiled).records:
            report.compile_times.append(record.compile_seconds)
            report.guards += [f"[{record.frame}] {g.describe()}" for g in record.guards.guards]
            if record.graph is not None:
                report.graphs.append(record.graph)
                report.ops_per_graph.append(_ops(record.graph))
            b = record.graph_break
            if b is not None:
                loc = b.location
                recorded = RecordedBreak(b.reason.id, b.detail, str(loc) if loc else "?",
                                         loc.line_text() if loc else "", b.reason.hint)
                (report.boundaries if b.reason.boundary else report.break_reasons).append(recorded)
        report.graph_count = len(report.graphs)
        report.graph_break_count = len(report.break_reasons)
        return report

    if extra_args or extra_kwargs:
        return run(*extra_args, **extra_kwargs)
    return run
