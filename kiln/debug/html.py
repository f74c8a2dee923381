"""`python -m kiln run --report out.html`: the report as one self-contained HTML page.

The same data as the text report (kiln.debug.report.collect): a summary table
of compiled regions, then per region the compile time by stage, graph breaks,
recompiles and, per graph, the captured graph as code, its diagram, the fused
graph of each ATen graph (kernels as clusters), the generated kernels and the
wrapper. No scripts, no external files: CSS and SVG are inline.
"""
from __future__ import annotations

import html
from pathlib import Path

from kiln import fallbacks
from kiln.capture.entry import CompileContext
from kiln.debug.diagram import fused_diagram, fx_diagram, to_svg
from kiln.debug.report import STAGES, GraphInfo, Region, break_location, collect

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px 32px; color: #1d2433; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 19px; margin-top: 32px; border-bottom: 2px solid #d9a400; }
h3 { font-size: 15px; margin-top: 22px; } .sub { color: #5c6780; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #c9d0dd; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #eef1f7; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f8fa; border: 1px solid #dde3ec; padding: 8px 10px; font-size: 12px; overflow-x: auto;
      max-height: 420px; }
details { margin: 6px 0; } summary { cursor: pointer; font-weight: 600; }
.diagram { overflow: auto; max-height: 600px; border: 1px solid #dde3ec; margin: 8px 0; background: white; }
.bar { display: inline-block; height: 10px; background: #d9a400; vertical-align: middle; }
.warn { color: #a33b00; }
"""


def _e(s) -> str:
    return html.escape(str(s))


def _table(head: list[str], rows: list[list], num: set[int] = frozenset()) -> str:
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td class='num'>{_e(c)}</td>" if i in num else f"<td>{_e(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def _stage_table(stages: dict[str, float]) -> str:
    total = sum(stages.values()) or 1.0
    rows = []
    for k in STAGES:
        v = stages.get(k, 0.0)
        if v >= 0.0005:
            rows.append(f"<tr><td>{k}</td><td class='num'>{v:.3f} s</td><td><span class='bar' "
                        f"style='width:{int(240 * v / total)}px'></span> {100 * v / total:.0f}%</td></tr>")
    return ("<table><tr><th>stage</th><th>time</th><th>share</th></tr>" + "".join(rows) + "</table>") if rows else ""


def _diagram(svg: str) -> str:
    return f"<div class='diagram'>{svg}</div>"


def _graph_section(g: GraphInfo, diagrams: bool) -> str:
    r = g.record
    out = [f"<h3 id='graph{r.id}'>graph {r.id}: {_e(r.frame)}</h3>",
           f"<p class='sub'>{r.op_count} ops · {g.num_kernels} kernels · compile {sum(g.stages.values()):.2f} s · "
           f"{r.calls} calls, {r.run_seconds * 1000:.1f} ms in compiled code</p>"]
    if g.aten_graphs:
        rows = []
        for cg in g.aten_graphs:
            a = cg.artefacts
            rows.append([a.get("name", "?"), a.get("num_kernels", 0),
                         f"fell back to ATen: {a['fallback']}" if "fallback" in a
                         else ", ".join(a.get("kernel_names", []))])
        out.append(_table(["ATen graph", "kernels", "kernel names"], rows, {1}))
    out.append("<details open><summary>captured graph (Python)</summary>"
               f"<pre>{_e(r.graph.code.strip())}</pre></details>")
    if diagrams:
        out.append("<details open><summary>captured graph (diagram)</summary>"
                   + _diagram(to_svg(fx_diagram(r.graph, f"graph {r.id}: {r.name}"))) + "</details>")
    for cg in g.aten_graphs:
        a = cg.artefacts
        name = _e(a.get("name", "?"))
        if diagrams and "fused_graph" in a:
            out.append(f"<details><summary>{name}: fused graph (kernels as clusters)</summary>"
                       + _diagram(to_svg(fused_diagram(a["fused_graph"], f"{a.get('name')}: fused graph")))
                       + "</details>")
        for key in ("kernels.cpp", "kernels.py"):
            if key in a:
                out.append(f"<details><summary>{name}: generated kernels ({key})</summary>"
                           f"<pre>{_e(a[key])}</pre></details>")
        if "wrapper.py" in a:
            out.append(f"<details><summary>{name}: wrapper</summary><pre>{_e(a['wrapper.py'])}</pre></details>")
    out.append(f"<details><summary>output program and guards</summary><pre>{_e(r.program_source)}</pre></details>")
    return "\n".join(out)


def _region_section(region: Region, diagrams: bool) -> str:
    out = [f"<h2 id='region{region.index}'>[{region.index}] {_e(region.name)}</h2>",
           f"<p class='sub'>backend {_e(region.backend)} · {len(region.graphs)} graphs · "
           f"{len(region.breaks)} graph breaks · {len(region.recompiles)} recompiles · "
           f"{region.run_seconds * 1000:.1f} ms in compiled code over {region.calls} calls</p>",
           "<h3>compile time by stage</h3>", _stage_table(region.stages)]
    if region.breaks:
        rows = []
        for r in region.breaks:
            where, text = break_location(r)
            b = r.graph_break
            rows.append([b.reason.id, b.detail, where, text, b.reason.hint])
        out += ["<h3>graph breaks</h3>", _table(["reason", "detail", "file:line", "source", "hint"], rows)]
    if region.recompiles:
        out += ["<h3>recompiles</h3>",
                _table(["graph", "frame", "failing guard"],
                       [[r.id, r.frame, r.recompile_reason] for r in region.recompiles])]
    out += [_graph_section(g, diagrams) for g in region.graphs]
    return "\n".join(out)


def html_report(contexts: list[CompileContext], title: str = "kiln report", summary: str | None = None,
                diagrams: bool = True) -> str:
    regions = collect(contexts)
    rows = [[f"[{r.index}] {r.name}", r.backend, len(r.graphs), sum(g.record.op_count for g in r.graphs), len(r.breaks),
             len(r.recompiles), sum(g.num_kernels for g in r.graphs), f"{r.compile_seconds:.2f} s",
             f"{r.run_seconds * 1000:.1f} ms"] for r in regions]
    body = [f"<h1>{_e(title)}</h1>"]
    if summary:
        body.append(f"<p>{_e(summary)}</p>")
    body.append(f"<pre class='warn'>{_e(fallbacks.summary())}</pre>" if fallbacks.records()
                else f"<p>{_e(fallbacks.summary())}</p>")
    body.append(_table(["compiled region", "backend", "graphs", "ops", "graph breaks", "recompiles", "kernels",
                        "compile time", "time in compiled code"], rows, {2, 3, 4, 5, 6, 7, 8})
                if regions else "<p class='warn'>no kiln.compile / torch.compile call ran</p>")
    body += [_region_section(r, diagrams) for r in regions]
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_html_report(path: str | Path, contexts: list[CompileContext], **kwargs) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(html_report(contexts, **kwargs), encoding="utf-8")
    return path
