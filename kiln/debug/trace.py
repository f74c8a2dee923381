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

The folders are created 0700 and checked like the cache's (kiln/runtime/private_files.py: a
folder that is a symlink, another user's or writable by others is refused with a warning, and
the files go to a private folder instead); each file is written to a new temporary name and
renamed into place, so a symlink planted at a file's path is replaced, never written through.
`index.md` lists the files this process wrote, not what earlier runs left in the folder.
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
from kiln.runtime.private_files import PrivateTree, write_atomic

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


_tree = PrivateTree("debug directory")
_written: dict[str, set[str]] = {}  # debug root -> the files this process wrote there, relative to it


def _write(root: Path, relative: str, text: str) -> None:
    """Write `text` to `root/relative` (folders checked and created 0700, the file renamed into place), and
    remember it for the index."""
    *parts, name = relative.split("/")
    write_atomic(_tree.folder(root, *parts) / name, text)
    _written.setdefault(str(root), set()).add(relative)


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
        _write(root, "fallbacks.txt", fallbacks.summary() + "\n")


def on_record(ctx: CompileContext, record: CaptureRecord) -> None:
    """Capture listener: write one captured graph's artefacts."""
    options = _options_of(ctx)
    if enabled(options):
        write_record(debug_dir(), record, diagram=_diagram(options))
        write_index(debug_dir())


def write_aten_graph(root: Path, compiled: CompiledGraph, diagram: bool = False) -> str:
    a = compiled.artefacts
    out = a.get("name", "aten")
    if "fallback" in a:
        _write(root, f"{out}/fallback.txt", a["fallback"] + "\n")
    for key, value in a.items():
        if key in ("fallback", "name", "num_kernels", "kernel_names", "fused_graph"):
            continue
        if key == "times":
            _write(root, f"{out}/times.json", json.dumps(value, indent=2) + "\n")
        elif key == "aten_graph":
            _write(root, f"{out}/aten_graph.py", str(value))
        else:
            _write(root, f"{out}/{key if '.' in key else f'{key}.txt'}", str(value))
    if diagram and "fused_graph" in a:
        _write(root, f"{out}/fused_graph.svg", to_svg(fused_diagram(a["fused_graph"], f"{a.get('name')}: fused graph")))
    return out


def write_record(root: Path, record: CaptureRecord, diagram: bool = False) -> str:
    out = f"graph{record.id}"
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
    _write(root, f"{out}/summary.txt", "\n".join(summary) + "\n")
    _write(root, f"{out}/output_program.py", record.program_source + "\n")
    _write(root, f"{out}/guards.txt", "\n".join(g.describe() for g in record.guards.guards) + "\n")
    _write(root, f"{out}/timings.json", json.dumps(info.stages, indent=2) + "\n")
    if record.graph is not None:
        _write(root, f"{out}/captured_graph.py", record.graph.print_readable(print_output=False))
        if diagram:
            title = f"graph {record.id}: {record.name}"
            _write(root, f"{out}/captured_graph.svg", to_svg(fx_diagram(record.graph, title)))
    write_aot(root, out, info.aot_traces)
    return out


def write_aot(root: Path, out: str, traces: list) -> None:
    variants: dict[str, list] = {}
    for variant, trace in traces:
        variants.setdefault(variant, []).append(trace)
    for k, (variant, passes) in enumerate(variants.items()):
        where = f"{out}/aot" if k == 0 else f"{out}/aot/{variant}"
        for i, t in enumerate(p for p in passes if p.graph is not None):
            fname = f"{i:02d}_{re.sub(r'[^A-Za-z0-9]+', '_', t.name).strip('_')}.py"
            _write(root, f"{where}/{fname}", f"# kiln.autograd pass {t.name!r} ({t.seconds * 1000:.1f} ms)\n"
                   + t.graph.print_readable(print_output=False))


def write_index(root: Path) -> None:
    """`index.md`: each graph folder and the files this process wrote in it."""
    lines = ["# kiln debug directory", "",
             "One directory per captured graph (`graphN`, N as in `python -m kiln run`'s report and the "
             "profiler range `kiln: <function> (graph N)`); `forward/`, `backward/`, `inference/` inside "
             "hold the code generator's artefacts for that ATen graph.", ""]
    written = _written.get(str(root), set())
    folders: dict[str, list[str]] = {}
    for rel in written:
        if "/" in rel:
            folders.setdefault(rel.split("/")[0], []).append(rel)

    def key(name: str):
        m = re.match(r"([a-z]+)(\d+)$", name)
        return (m.group(1), int(m.group(2))) if m else (name, 0)

    if "fallbacks.txt" in written:
        lines += [f"[fallbacks.txt](fallbacks.txt) — {FILES['fallbacks.txt']}", ""]
    for name in sorted(folders, key=key):
        summary = f"{name}/summary.txt"
        head = (_tree.folder(root, name) / "summary.txt").read_text().splitlines()[0] if summary in written else name
        lines.append(f"## {name}: {head}")
        for rel in sorted(folders[name]):
            base = rel.rsplit("/", 1)[1]
            lines.append(f"- [{rel}]({rel}) — {FILES.get(base, 'kiln.autograd pass graph' if '/aot/' in rel else '')}")
        lines.append("")
    _write(root, "index.md", "\n".join(lines))


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
