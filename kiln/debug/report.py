"""The end-of-run report of `python -m kiln run`: fallbacks, then per compiled region, graphs, breaks,
recompiles, timings.

`collect(contexts)` turns the compile contexts into plain data (`Region`,
`GraphInfo`); `text_report` prints it, `kiln.debug.html.html_report` renders the
same data as a page. Compile time is split by stage:

    capture     the bytecode interpreter, guards and output program (CaptureRecord)
    autograd    kiln.autograd's passes: analyze, trace, functionalize, partition (AOTCompiled.traces)
    lowering    decompositions and the loop-level IR  (CompiledGraph.artefacts["times"], by kiln.pipeline.STAGES)
    scheduling  fusion and the memory plan
    codegen     kernel and wrapper source (the pipeline's generate stage)
    build       the C++ compiler (or the build cache), the wrapper loaded
    backend     time in a backend that is not kiln's inductor (eager, aot_eager, a user's)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln import fallbacks
from kiln.capture.entry import CaptureRecord, CompileContext

STAGES = ("capture", "autograd", "lowering", "scheduling", "codegen", "build", "backend")
# kiln.pipeline.STAGES -> the report's stage
_CODEGEN_STAGES = {"decompose": "lowering", "lower": "lowering", "schedule": "scheduling",
                   "plan memory": "scheduling", "generate": "codegen", "build": "build"}
MAX_GRAPH_LINES = 40  # graph code shown per graph in the text report
MAX_LINE = 150
MAX_KERNEL_NAMES = 6


@dataclass
class GraphInfo:
    """One captured graph (one CaptureRecord) and what the backend made of it."""

    record: CaptureRecord
    stages: dict[str, float]
    aten_graphs: list[Any]  # CompiledGraph objects (forward, backward, inference), in compile order
    aot_traces: list[tuple[str, Any]]  # (variant, Trace) of kiln.autograd's passes

    @property
    def num_kernels(self) -> int:
        return sum(g.artefacts.get("num_kernels", 0) for g in self.aten_graphs)

    @property
    def kernel_names(self) -> list[str]:
        return [k for g in self.aten_graphs for k in g.artefacts.get("kernel_names", [])]


@dataclass
class Region:
    """One compiled function (its entry and continuations): its backend and graphs. kiln.compile calls naming one
    backend share a context; each function compiled in it is a region of its own."""

    index: int
    name: str
    backend: str
    graphs: list[GraphInfo] = field(default_factory=list)
    breaks: list[CaptureRecord] = field(default_factory=list)
    recompiles: list[CaptureRecord] = field(default_factory=list)
    run_seconds: float = 0.0
    calls: int = 0
    graphless_capture: float = 0.0  # captures that produced no graph (a continuation with no tensor ops)

    @property
    def stages(self) -> dict[str, float]:
        total = dict.fromkeys(STAGES, 0.0)
        total["capture"] = self.graphless_capture
        for g in self.graphs:
            for k, v in g.stages.items():
                total[k] += v
        return total

    @property
    def compile_seconds(self) -> float:
        return sum(self.stages.values())


def backend_name(backend: Any) -> str:
    return str(getattr(backend, "name", None) or getattr(backend, "__name__", None) or type(backend).__name__)


def graph_info(record: CaptureRecord) -> GraphInfo:
    compiled = record.compiled
    aten_graphs = list(getattr(compiled, "compiled_graphs", None) or [])
    traces = []
    for key, passes in (getattr(compiled, "traces", None) or {}).items():
        variant = "inference" if key[0] is None else "training"
        traces += [(variant, t) for t in passes]
    stages = dict.fromkeys(STAGES, 0.0)
    stages["capture"] = max(0.0, record.compile_seconds - record.backend_seconds)
    if traces or aten_graphs:
        stages["autograd"] = sum(t.seconds for _, t in traces if not t.name.startswith("compile"))
        for g in aten_graphs:
            for k, v in g.artefacts.get("times", {}).items():
                stages[_CODEGEN_STAGES.get(k, "codegen")] += v
    else:
        stages["backend"] = record.backend_seconds
    return GraphInfo(record, stages, aten_graphs, traces)


def collect(contexts: list[CompileContext]) -> list[Region]:
    regions = []
    for ctx in contexts:
        for records in _by_function(list(ctx.records)):
            regions.append(_region(len(regions) + 1, ctx, records))
    return regions


def _by_function(records: list[CaptureRecord]) -> list[list[CaptureRecord]]:
    """The records of each function, in the order the functions were first captured (one empty list: a context
    whose functions were never called)."""
    groups: dict[str, list[CaptureRecord]] = {}
    for r in records:
        groups.setdefault(r.function, []).append(r)
    return list(groups.values()) or [[]]


def _region(index: int, ctx: CompileContext, records: list[CaptureRecord]) -> Region:
    """The region of one function's records. Its time in compiled code is its programs' (a function it calls
    compiled is counted in its own region and, where called from a program, in the caller's too)."""
    name = records[0].frame if records else "(never called)"
    region = Region(index, name, backend_name(ctx.backend), run_seconds=sum(r.run_seconds for r in records))
    for r in records:
        if r.graph is not None:
            region.graphs.append(graph_info(r))
        else:
            region.graphless_capture += r.compile_seconds
        if r.graph_break is not None and not any(same_break(r, seen) for seen in region.breaks):
            region.breaks.append(r)  # a recompile captures the same break again: listed once
        if r.recompile_reason:
            region.recompiles.append(r)
        region.calls += r.calls if r.frame == name else 0
    return region


def same_break(a: CaptureRecord, b: CaptureRecord) -> bool:
    """Two captures met the same graph break: the same reason at the same place of the same frame."""
    return (a.frame, a.graph_break.reason.id, break_location(a)) == (b.frame, b.graph_break.reason.id,
                                                                        break_location(b))


def format_stages(stages: dict[str, float]) -> str:
    return " | ".join(f"{k} {v:.2f} s" for k, v in stages.items() if v >= 0.0005) or "-"


def break_location(record: CaptureRecord) -> tuple[str, str]:
    b = record.graph_break
    if b.location is None:
        return "?", ""
    return f"{b.location.filename}:{b.location.lineno}", b.location.line_text().strip()


def _clip(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[:MAX_LINE - 3] + "..."


def text_report(contexts: list[CompileContext], summary: str | None = None) -> str:
    regions = collect(contexts)
    lines = ["", "=" * 78, "kiln report", "=" * 78]
    if summary:
        lines.append(summary)
    lines.append(fallbacks.summary())
    if not regions:
        lines.append("no kiln.compile / torch.compile call ran")
    for region in regions:
        lines.append(f"\n[{region.index}] {region.name}  backend={region.backend}")
        lines.append(f"    graphs: {len(region.graphs)}   ops: {sum(g.record.op_count for g in region.graphs)}   "
                     f"graph breaks: {len(region.breaks)}   recompiles: {len(region.recompiles)}   "
                     f"kernels: {sum(g.num_kernels for g in region.graphs)}")
        lines.append(f"    compile time: {region.compile_seconds:.2f} s  ({format_stages(region.stages)})")
        if region.calls:
            lines.append(f"    time in compiled code: {region.run_seconds * 1000:.1f} ms over {region.calls} calls "
                         "(forward programs; backward graphs run inside autograd)")
        else:
            lines.append("    time in compiled code: not measured (python -m kiln run measures it)")
        for r in region.breaks:
            where, text = break_location(r)
            b = r.graph_break
            lines.append(f"    graph break ({b.reason.id}) {b.detail}\n        at {where}: {text}\n"
                         f"        hint: {b.reason.hint}")
        for r in region.recompiles:
            lines.append(f"    recompile of {r.frame} (graph {r.id}): {r.recompile_reason}")
        for g in region.graphs:
            r = g.record
            lines.append(f"    graph {r.id}: {r.frame}  ({r.op_count} ops, {g.num_kernels} kernels, compile "
                         f"{sum(g.stages.values()):.2f} s, {r.calls} calls {r.run_seconds * 1000:.1f} ms)")
            for cg in g.aten_graphs:
                a = cg.artefacts
                names = a.get("kernel_names", [])
                what = ", ".join(names[:MAX_KERNEL_NAMES])
                if len(names) > MAX_KERNEL_NAMES:
                    what += f", ... ({len(names)} kernels)"
                if "fallback" in a:
                    what = f"fell back to ATen: {a['fallback']}"
                lines.append(f"        {a.get('name', '?')}: {what or 'no kernels'}")
            code = r.graph.code.strip().splitlines()
            lines += ["        | " + _clip(line) for line in code[:MAX_GRAPH_LINES]]
            if len(code) > MAX_GRAPH_LINES:
                lines.append(f"        | ... {len(code) - MAX_GRAPH_LINES} more lines "
                             "(--report out.html or KILN_DEBUG_DIR shows all)")
    return "\n".join(lines)
