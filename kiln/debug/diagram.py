"""Graph diagrams as SVG: the captured FX graph, and the fused graph with one cluster per kernel.

A diagram is plain data first (`Diagram`: nodes, edges, clusters), then SVG.
With Graphviz's `dot` on the PATH (Debian: `apt-get install graphviz`) the
layout is dot's; without it a small built-in layered layout draws the same
diagram, so reports and the debug directory never depend on an external tool.
"""
from __future__ import annotations

import html
import shutil
import subprocess
from dataclasses import dataclass, field

import torch

MAX_NODES = 400  # past this a diagram is unreadable; draw the first MAX_NODES nodes


@dataclass
class Diagram:
    title: str
    nodes: list[tuple[str, str, str | None]] = field(default_factory=list)  # (id, label, cluster or None)
    edges: list[tuple[str, str]] = field(default_factory=list)
    clusters: dict[str, str] = field(default_factory=dict)  # cluster id -> label


def fx_diagram(gm: torch.fx.GraphModule, title: str = "captured graph") -> Diagram:
    """A captured graph's nodes: inputs, attributes, calls (by target name) and the output."""
    d = Diagram(title)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            label = f"input {node.target}"
        elif node.op == "get_attr":
            label = f"self.{node.target}"
        elif node.op == "output":
            label = "output"
        else:
            target = getattr(node.target, "__name__", str(node.target))
            label = node.name if node.name.rstrip("0123456789").rstrip("_") == target else f"{node.name} = {target}"
        val = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(val, torch.Tensor):
            label += f"  {str(val.dtype).replace('torch.', '')}{list(val.shape)}"
        d.nodes.append((node.name, label, None))
        d.edges += [(src.name, node.name) for src in node.all_input_nodes]
    return d


def fused_diagram(data: dict, title: str = "fused graph") -> Diagram:
    """The code generator's `fused_graph` artefact (see kiln/codegen/describe.py) as a Diagram."""
    return Diagram(title, list(data["nodes"]), list(data["edges"]), dict(data["clusters"]))


def to_dot(d: Diagram) -> str:
    q = lambda s: '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'  # noqa: E731
    nodes = d.nodes[:MAX_NODES]
    kept = {n[0] for n in nodes}
    lines = [f"digraph {q(d.title)} {{", "  rankdir=TB;", '  node [shape=box, style="rounded,filled", '
             'fillcolor="#f4f6fb", fontname="Helvetica", fontsize=10];', '  edge [color="#7a869a"];']
    for cid, label in d.clusters.items():
        members = [n for n in nodes if n[2] == cid]
        if not members:
            continue
        lines.append(f"  subgraph {q('cluster_' + cid)} {{")
        lines.append(f'    label={q(label)}; style="rounded,filled"; fillcolor="#fff4d6"; color="#d9a400"; '
                     'fontname="Helvetica";')
        lines += [f"    {q(n[0])} [label={q(n[1])}];" for n in members]
        lines.append("  }")
    lines += [f"  {q(n[0])} [label={q(n[1])}];" for n in nodes if n[2] not in d.clusters]
    lines += [f"  {q(a)} -> {q(b)};" for a, b in d.edges if a in kept and b in kept]
    lines.append("}")
    return "\n".join(lines)


def to_svg(d: Diagram, engine: str | None = "auto") -> str:
    """SVG text of `d`: through `dot` when available (engine="auto" or "dot"), else the built-in layout."""
    dot = shutil.which("dot") if engine in ("auto", "dot") else None
    if dot:
        try:
            out = subprocess.run([dot, "-Tsvg"], input=to_dot(d), capture_output=True, text=True, timeout=60)
            if out.returncode == 0 and "<svg" in out.stdout:
                return out.stdout[out.stdout.index("<svg"):]
        except (OSError, subprocess.SubprocessError):
            pass
    return _layered_svg(d)


# ------------------------------------------------------------------------------------------
# The built-in layout: longest-path layers top to bottom, nodes of a cluster kept adjacent
# ------------------------------------------------------------------------------------------

_W, _H, _GAP_X, _GAP_Y, _CHAR = 190, 26, 16, 34, 6.2


def _layered_svg(d: Diagram) -> str:
    nodes = d.nodes[:MAX_NODES]
    ids = {n[0] for n in nodes}
    preds: dict[str, list[str]] = {n[0]: [] for n in nodes}
    for a, b in d.edges:
        if a in ids and b in ids:
            preds[b].append(a)
    layer: dict[str, int] = {}
    for nid, _, _ in nodes:  # nodes come in topological order (FX order, schedule order)
        layer[nid] = 1 + max((layer.get(p, -1) for p in preds[nid]), default=-1)
    # a cluster's nodes share its first layer's row band: lay out each cluster as one block per layer
    rows: dict[int, list[tuple[str, str, str | None]]] = {}
    for n in nodes:
        rows.setdefault(layer[n[0]], []).append(n)
    pos: dict[str, tuple[float, float]] = {}
    width = 0.0
    for r, members in sorted(rows.items()):
        members.sort(key=lambda n: (n[2] or "", ))
        for k, (nid, _, _) in enumerate(members):
            pos[nid] = (20 + k * (_W + _GAP_X), 40 + r * (_H + _GAP_Y))
        width = max(width, 20 + len(members) * (_W + _GAP_X))
    height = 40 + (max(rows, default=0) + 1) * (_H + _GAP_Y) + 20
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="Helvetica, Arial, sans-serif" font-size="10">',
           f'<text x="20" y="22" font-size="13" font-weight="bold">{html.escape(d.title)}</text>',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" '
           'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#7a869a"/></marker></defs>']
    for cid, label in d.clusters.items():
        boxes = [pos[n[0]] for n in nodes if n[2] == cid]
        if not boxes:
            continue
        x0, y0 = min(b[0] for b in boxes) - 6, min(b[1] for b in boxes) - 18
        x1, y1 = max(b[0] for b in boxes) + _W + 6, max(b[1] for b in boxes) + _H + 6
        out.append(f'<g class="cluster"><rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" rx="8" '
                   f'fill="#fff4d6" stroke="#d9a400"/><text x="{x0 + 6}" y="{y0 + 12}">{html.escape(label)}</text></g>')
    for a, b in d.edges:
        if a in pos and b in pos:
            (xa, ya), (xb, yb) = pos[a], pos[b]
            out.append(f'<line x1="{xa + _W / 2}" y1="{ya + _H}" x2="{xb + _W / 2}" y2="{yb}" stroke="#7a869a" '
                       f'marker-end="url(#arrow)"/>')
    max_chars = int(_W / _CHAR) - 1
    for nid, label, _ in nodes:
        x, y = pos[nid]
        text = label if len(label) <= max_chars else label[:max_chars - 1] + "…"
        out.append(f'<g class="node"><title>{html.escape(label)}</title><rect x="{x}" y="{y}" width="{_W}" '
                   f'height="{_H}" rx="5" fill="#f4f6fb" stroke="#3d4b66"/><text x="{x + 6}" y="{y + 17}">'
                   f'{html.escape(text)}</text></g>')
    out.append("</svg>")
    return "\n".join(out)
