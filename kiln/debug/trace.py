"""The debug directory: every stage's artefact per compiled graph, in one predictable layout.

On when `KILN_DEBUG_DIR=path` is set, `TORCH_COMPILE_DEBUG=1` (torch's switch, honoured for scripts written
for torch.compile) or `kiln.compile(options={"trace.enabled": True})`; the directory is `kiln.config.debug_dir`,
else `$KILN_DEBUG_DIR`, else `./kiln_debug`.

    <debug dir>/
      index.md                    every graph directory and file, with what it holds
      fallbacks.txt               fallbacks by kind, then each (kiln/fallbacks.py), once there is one
      graph<N>/                   kiln's captured graph N (N as in the report and the profiler range)
        summary.txt               function, ops, graph break, recompile reason, compile time by stage
        captured_graph.py         the FX graph, as readable Python
        output_program.py         the guard function and the output program that calls the graph
        guards.txt                the guards, one per line, by kind
        timings.json              compile time by stage (seconds)
        captured_graph.svg        with options={"trace.graph_diagram": True}
        aot/<NN>_<pass>.py        kiln.autograd's passes in order: trace joint, joint, forward, backward
                                  (or trace, inference); a later variant under aot/<variant>_<k>/
        forward/ backward/ inference/   the code generator's artefacts for that ATen graph:
          aten_graph.py           the ATen graph compiled
          ir.txt                  loop-level IR before fusion
          schedule.txt            kernels after fusion (fusion groups)
          memory.txt              the memory plan
          kernels.cpp             generated kernels (kernels.py for Triton)
          wrapper.py              the host program
          times.json              decompose, lower, schedule, plan memory, generate, build (seconds)
          fused_graph.svg         with options={"trace.graph_diagram": True}
      aten<K>/                    ATen graphs from elsewhere (torch.compile(backend=kiln.inductor))

The capture stage and the code generator call the listeners installed by
`install()`; they never import this module.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from kiln import fallbacks
from kiln.capture.entry import CaptureRecord, CompileContext
from kiln.config import CompileOptions, debug_dir
from kiln.debug.diagram import fused_diagram, fx_diagram, to_svg
from kiln.debug.report import format_stages, graph_info
from kiln.pipeline import CompiledGraph

FILES = {
    "summary.txt": "function, ops, graph break, recompile reason, compile time by stage",
    "captured_graph.py": "the captured FX graph",
    "output_program.py": "guard function + output program",
    "guards.txt": "guards by kind",
    "timings.json": "compile time by stage",
    "captured_graph.svg": "diagram of the captured graph",
    "aten_graph.py": "ATen graph handed to the code generator",
    "ir.txt": "loop-level IR before fusion",
    "schedule.txt": "kernels after fusion",
    "memory.txt": "memory plan",
    "kernels.cpp": "generated C++ kernels",
    "kernels.py": "generated Triton kernels",
    "wrapper.py": "host program (wrapper)",
    "times.json": "code generator time by stage",
    "fused_graph.svg": "diagram of the fused graph (kernels as clusters)",
    "fallback.txt": "why the graph runs through ATen",
    "fallbacks.txt": "fallbacks by kind, then each",
}


def enabled(options: CompileOptions | None) -> bool:
    return (bool(os.environ.get("KILN_DEBUG_DIR")) or os.environ.get("TORCH_COMPILE_DEBUG") == "1"
            or (options is not None and options.trace_enabled))


def _diagram(options: CompileOptions | None) -> bool:
    return options is not None and options.trace_graph_diagram


def _options_of(ctx: CompileContext) -> CompileOptions | None:
    """The options kiln's inductor was bound with (None for a backend that takes none)."""
    options = getattr(ctx.backend, "options", None)
    return options if isinstance(options, CompileOptions) else None


def on_graph(compiled: CompiledGraph, options: CompileOptions) -> None:
    """Code generator listener: write one ATen graph's artefacts."""
    if enabled(options):
        write_aten_graph(debug_dir(), compiled, diagram=_diagram(options))
        write_fallbacks(debug_dir())
        write_index(debug_dir())


def on_fallback(fallback: fallbacks.Fallback) -> None:
    """kiln.fallbacks listener: keep `fallbacks.txt` current (where KILN_DEBUG_DIR turns the directory on; a
    graph's own `trace.enabled` writes it with the graph)."""
    if enabled(None):
        write_fallbacks(debug_dir())


def write_fallbacks(root: Path) -> None:
    if fallbacks.records() or fallbacks.breaks:
        root.mkdir(parents=True, exist_ok=True)
        (root / "fallbacks.txt").write_text(fallbacks.summary() + "\n")


def on_record(ctx: CompileContext, record: CaptureRecord) -> None:
    """Capture listener: write one captured graph's artefacts."""
    options = _options_of(ctx)
    if enabled(options):
        write_record(debug_dir(), record, diagram=_diagram(options))
        write_index(debug_dir())


def write_aten_graph(root: Path, compiled: CompiledGraph, diagram: bool = False) -> Path:
    a = compiled.artefacts
    out = root / a.get("name", "aten")
    out.mkdir(parents=True, exist_ok=True)
    if "fallback" in a:
        (out / "fallback.txt").write_text(a["fallback"] + "\n")
    for key, value in a.items():
        if key in ("fallback", "name", "num_kernels", "kernel_names", "fused_graph"):
            continue
        if key == "times":
            (out / "times.json").write_text(json.dumps(value, indent=2) + "\n")
        elif key == "aten_graph":
            (out / "aten_graph.py").write_text(str(value))
        else:
            (out / (key if "." in key else f"{key}.txt")).write_text(str(value))
    if diagram and "fused_graph" in a:
        (out / "fused_graph.svg").write_text(to_svg(fused_diagram(a["fused_graph"], f"{a.get('name')}: fused graph")))
    return out


def write_record(root: Path, record: CaptureRecord, diagram: bool = False) -> Path:
    out = root / f"graph{record.id}"
    out.mkdir(parents=True, exist_ok=True)
    info = graph_info(record)
    summary = [f"graph {record.id}: {record.frame}", f"ops: {record.op_count}",
               f"compile time: {format_stages(info.stages)}"]
    if record.graph_break is not None:
        b = record.graph_break
        summary.append(f"graph break ({b.reason.id}) {b.detail} at {b.location}: "
                       f"{b.location.line_text().strip() if b.location else ''}")
    if record.recompile_reason:
        summary.append(f"recompiled because: {record.recompile_reason}")
    summary += [f"ATen graph {g.artefacts.get('name')}: "
                f"{', '.join(g.artefacts.get('kernel_names', [])) or 'no kernels'}"
                for g in info.aten_graphs]
    (out / "summary.txt").write_text("\n".join(summary) + "\n")
    (out / "output_program.py").write_text(record.program_source + "\n")
    (out / "guards.txt").write_text("\n".join(g.describe() for g in record.guards.guards) + "\n")
    (out / "timings.json").write_text(json.dumps(info.stages, indent=2) + "\n")
    if record.graph is not None:
        (out / "captured_graph.py").write_text(record.graph.print_readable(print_output=False))
        if diagram:
            title = f"graph {record.id}: {record.name}"
            (out / "captured_graph.svg").write_text(to_svg(fx_diagram(record.graph, title)))
    write_aot(out, info.aot_traces)
    return out


def write_aot(out: Path, traces: list) -> None:
    variants: dict[str, list] = {}
    for variant, trace in traces:
        variants.setdefault(variant, []).append(trace)
    for k, (variant, passes) in enumerate(variants.items()):
        where = out / "aot" if k == 0 else out / "aot" / variant
        where.mkdir(parents=True, exist_ok=True)
        for i, t in enumerate(p for p in passes if p.graph is not None):
            fname = f"{i:02d}_{re.sub(r'[^A-Za-z0-9]+', '_', t.name).strip('_')}.py"
            (where / fname).write_text(f"# kiln.autograd pass {t.name!r} ({t.seconds * 1000:.1f} ms)\n"
                                       + t.graph.print_readable(print_output=False))


def write_index(root: Path) -> None:
    lines = ["# kiln debug directory", "",
             "One directory per captured graph (`graphN`, N as in `python -m kiln run`'s report and the "
             "profiler range `kiln: <function> (graph N)`); `forward/`, `backward/`, `inference/` inside "
             "hold the code generator's artefacts for that ATen graph.", ""]

    def key(p: Path):
        m = re.match(r"([a-z]+)(\d+)$", p.name)
        return (m.group(1), int(m.group(2))) if m else (p.name, 0)

    if (root / "fallbacks.txt").exists():
        lines += [f"[fallbacks.txt](fallbacks.txt) — {FILES['fallbacks.txt']}", ""]
    for d in sorted((p for p in root.iterdir() if p.is_dir()), key=key):
        head = (d / "summary.txt").read_text().splitlines()[0] if (d / "summary.txt").exists() else d.name
        lines.append(f"## {d.name}: {head}")
        for f in sorted(p for p in d.rglob("*") if p.is_file()):
            rel = f.relative_to(root).as_posix()
            lines.append(f"- [{rel}]({rel}) — {FILES.get(f.name, 'kiln.autograd pass graph' if 'aot' in rel else '')}")
        lines.append("")
    (root / "index.md").write_text("\n".join(lines))


def flush(contexts: list[CompileContext]) -> None:
    """Rewrite every graph directory (variants compiled lazily after their capture join their graph's)."""
    written = False
    for ctx in contexts:
        options = _options_of(ctx)
        if enabled(options):
            for record in ctx.records:
                write_record(debug_dir(), record, diagram=_diagram(options))
                written = True
    if written or enabled(None):
        write_fallbacks(debug_dir())
    if written:
        write_index(debug_dir())
