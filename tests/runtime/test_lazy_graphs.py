"""Lazily built graph modules: no Python code until run or read, then the code an eager GraphModule has."""
from __future__ import annotations

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.autograd import aot_compile
from kiln.runtime.lazy_graphs import graph_module, lazily_built, printed_graph_module, source


def f(x, y):
    return [torch.relu(x @ y).sum(0), x.t() * 2]


def _unbuilt(gm) -> bool:
    return type(gm).forward is type(gm)._lazy_forward


def test_a_lazy_graph_module_runs_and_reads_as_an_eager_one():
    x, y = torch.randn(3, 4), torch.randn(4, 5)
    eager = make_fx(f)(x, y)
    lazy = graph_module(eager, eager.graph)
    assert _unbuilt(lazy)
    assert source(lazy) == eager.code and _unbuilt(lazy)  # the source, without compiling it
    torch.testing.assert_close(lazy(x, y), f(x, y))
    assert not _unbuilt(lazy) and lazy.code == eager.code


def test_traced_within_lazily_built_generates_code_on_first_call():
    x, y = torch.randn(3, 4), torch.randn(4, 5)
    with lazily_built():
        gm = make_fx(f)(x, y)
    assert _unbuilt(gm)
    torch.testing.assert_close(gm(x, y), f(x, y))


def test_the_autograd_stage_hands_the_compiler_graphs_without_generated_code():
    """The forward and backward are read node by node by a code generator: nothing generates their Python code
    unless it runs them."""
    seen = []

    def compiler(gm, example_inputs):
        seen.append(_unbuilt(gm))
        return gm

    x, y = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5)
    compiled = aot_compile(torch.fx.symbolic_trace(f), [x, y], compiler)
    assert seen == [True, True]
    out = compiled(x, y)
    torch.testing.assert_close(out, f(x, y))
    out[0].sum().backward()
    expected = x.detach().requires_grad_()
    f(expected, y)[0].sum().backward()
    torch.testing.assert_close(x.grad, expected.grad)


def _relu_to_sigmoid(gm) -> None:
    for node in gm.graph.nodes:
        if node.target is torch.ops.aten.relu.default:
            node.target = torch.ops.aten.sigmoid.default


def test_a_printed_graph_module_reads_as_its_printing_until_recompiled():
    """`source` of a printed module is the code printed when it was built (no second printing, no compile); a
    recompile() (or a new graph) drops it, so a key never reads the code of the graph as it was."""
    x, y = torch.randn(3, 4), torch.randn(4, 5)
    eager = make_fx(f)(x, y)
    printed, code = printed_graph_module(eager, eager.graph)
    assert code == eager.code and source(printed) is code and _unbuilt(printed)
    torch.testing.assert_close(printed(x, y), f(x, y))

    printed, _ = printed_graph_module(eager, make_fx(f)(x, y).graph)
    _relu_to_sigmoid(printed)
    printed.recompile()
    assert "aten.sigmoid" in source(printed) and "aten.relu" not in source(printed)
    assert torch.allclose(printed(x, y)[0], torch.sigmoid(x @ y).sum(0))

    printed, _ = printed_graph_module(eager, make_fx(f)(x, y).graph)
    other = make_fx(f)(x, y)
    _relu_to_sigmoid(other)
    printed.graph = other.graph
    assert "aten.sigmoid" in source(printed)
