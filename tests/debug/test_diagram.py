"""Diagrams: the captured graph and the fused graph (kernels as clusters) as SVG, with dot or the built-in layout."""
from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET

import pytest
import torch

import kiln
from kiln.debug.diagram import fused_diagram, fx_diagram, to_dot, to_svg
from kiln.pipeline import compile_aten_graph


def _softmax_graph():
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(4, 8)
    gm = make_fx(lambda x: (x.sin() * 2).softmax(-1) + x.cos().sum(-1, keepdim=True))(x)
    return gm, compile_aten_graph(gm, [x])


def test_fused_graph_has_one_cluster_per_kernel():
    _, compiled = _softmax_graph()
    data = compiled.artefacts["fused_graph"]
    assert set(data["clusters"]) == set(compiled.artefacts["kernel_names"])
    dot = to_dot(fused_diagram(data))
    assert dot.count("subgraph \"cluster_") == len(data["clusters"])


@pytest.mark.parametrize("engine", [None, "dot"])
def test_svg_is_well_formed_with_nodes_edges_and_clusters(engine):
    if engine == "dot" and shutil.which("dot") is None:
        pytest.skip("graphviz's dot is not installed")
    gm, compiled = _softmax_graph()
    for diagram in (fx_diagram(gm), fused_diagram(compiled.artefacts["fused_graph"])):
        svg = to_svg(diagram, engine=engine)
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg")
        text = "".join(root.itertext())
        assert "output" in text
    svg = to_svg(fused_diagram(compiled.artefacts["fused_graph"]), engine=engine)
    assert "cluster" in svg and compiled.artefacts["kernel_names"][0] in svg


def test_graph_diagram_is_a_registered_option():
    assert {"trace.graph_diagram", "check_accuracy", "trace.enabled"} <= set(kiln.list_options())
    with pytest.raises(TypeError):
        kiln.compile(lambda x: x, options={"trace.graph_diagram": "yes"})
