"""The end-of-run report of `python -m kiln run`: per compiled region, graphs, breaks, recompiles, timings."""
from __future__ import annotations

from kiln.capture.entry import CompileContext


def text_report(contexts: list[CompileContext]) -> str:
    lines = ["", "=" * 78, "kiln report", "=" * 78]
    if not contexts:
        lines.append("no kiln.compile / torch.compile call ran")
    for n, ctx in enumerate(contexts, 1):
        records = ctx.records
        graphs = [r for r in records if r.graph is not None]
        breaks = [r for r in records if r.graph_break is not None]
        recompiles = [r for r in records if r.recompile_reason]
        compile_s = sum(r.compile_seconds for r in records)
        name = records[0].frame if records else "(never called)"
        lines.append(f"\n[{n}] {name}  backend={getattr(ctx.backend, 'name', getattr(ctx.backend, '__name__', ctx.backend))}")
        lines.append(f"    graphs: {len(graphs)}   ops: {sum(r.op_count for r in records)}   graph breaks: {len(breaks)}   "
                     f"recompiles: {len(recompiles)}   compile time: {compile_s:.2f} s")
        for r in breaks:
            b = r.graph_break
            where = f"{b.location}" if b.location else "?"
            lines.append(f"    break ({b.reason.id}) {b.detail}\n        at {where}: "
                         f"{b.location.line_text() if b.location else ''}\n        hint: {b.reason.hint}")
        for r in recompiles:
            lines.append(f"    recompile of {r.frame}: {r.recompile_reason}")
        for i, r in enumerate(graphs, 1):
            lines.append(f"    graph {i} of {r.frame} ({r.op_count} ops):")
            lines += ["        " + line for line in r.graph.code.strip().splitlines()]
    return "\n".join(lines)
