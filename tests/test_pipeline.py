"""kiln/pipeline.py: the default backend's stages, named, in order, each timed through one helper.

The stage list is what the module shows a reader (its docstring and `_compile_stages`) and what every
compiled graph records (`artefacts["times"]`); these tests keep the three in step.
"""
from __future__ import annotations

import ast
import inspect
import logging
import operator
from pathlib import Path

import pytest
import torch

import kiln
from kiln import pipeline
from kiln.config import CompileOptions, validate_options
from kiln.pipeline import STAGES, Stages, compile_aten_graph
from support.lowering import trace

KILN = Path(kiln.__file__).parent


def stage_calls() -> list[str]:
    """The stage names `_compile_stages` and `_kernel_stages` (the stages it retries after a kernel falls back)
    pass to their stage runner, in the order they run them."""
    names = []
    for function in (pipeline._compile_stages, pipeline._kernel_stages):
        tree = ast.parse(inspect.getsource(function))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "run"]
        names += [c.args[0].value for c in sorted(calls, key=lambda c: c.lineno)]
    return names


def test_the_stage_list_prints_in_order():
    assert STAGES == ("decompose", "lower", "schedule", "plan memory", "generate", "build")
    assert stage_calls() == list(STAGES)  # one line per stage, each through the runner
    in_doc = [pipeline.__doc__.find(f"\n    {stage}  ") for stage in STAGES]  # the docstring's stage table
    assert -1 not in in_doc and in_doc == sorted(in_doc)


def test_timings_are_recorded_per_stage(caplog):
    x = torch.randn(4, 8)
    with caplog.at_level(logging.DEBUG, logger="kiln.pipeline"):
        compiled = compile_aten_graph(trace(lambda x: x.exp().sum(-1), x), [x])
    times = compiled.artefacts["times"]
    assert list(times) == list(STAGES)
    assert all(isinstance(t, float) and t >= 0 for t in times.values())
    logged = [r.getMessage() for r in caplog.records if r.name == "kiln.pipeline" and r.levelno == logging.DEBUG]
    assert [m.split(": ", 1)[1].rsplit(" ", 2)[0] for m in logged] == list(STAGES)  # "aten3: plan memory 0.1 ms"


def test_the_stage_runner_times_a_stage_that_raises_and_lets_the_error_through():
    with Stages("test", ("first", "second")) as run:
        assert run("first", lambda a, b: a + b, 2, 3) == 5
        with pytest.raises(ZeroDivisionError):
            run("second", lambda: 1 / 0)
    assert list(run.times) == ["first", "second"]
    assert "first" in run.summary() and "second" in run.summary()


@pytest.mark.allows_fallback("graph: the decompose stage refuses an in-place graph")
def test_a_failing_stage_runs_the_graph_through_aten_and_says_which_error():
    x = torch.randn(4)
    gm = trace(lambda x: x.add_(1), x.clone())  # in place: the decompose stage refuses it
    compiled = compile_aten_graph(gm, [x])
    assert "in-place ops" in compiled.artefacts["fallback"]
    torch.testing.assert_close(compiled(x.clone()), x + 1)


def test_listeners_receive_the_frozen_options_the_graph_was_compiled_with():
    seen = []
    pipeline.GRAPH_LISTENERS.append(lambda compiled, options: seen.append(options))
    try:
        x = torch.randn(3)
        compile_aten_graph(trace(lambda x: x.cos(), x), [x], {"epilogue_fusion": False})
    finally:
        pipeline.GRAPH_LISTENERS.pop()
    assert seen == [validate_options(None, {"epilogue_fusion": False})]
    assert isinstance(seen[0], CompileOptions)


def test_cpu_backend_option_picks_the_triton_printer_through_kiln_compile(compiled_graphs):
    from support.triton_device import INTERPRETING, skip_unless_kernels_run

    skip_unless_kernels_run()
    if not INTERPRETING:
        pytest.skip("the Triton printer runs CPU tensors only under TRITON_INTERPRET=1")
    def fn(x):
        return (x * 2).relu()

    x = torch.randn(5)
    torch.testing.assert_close(kiln.compile(fn, options={"cpu_backend": "triton"})(x), fn(x))
    assert "kernels.py" in compiled_graphs[-1].artefacts and "kernels.cpp" not in compiled_graphs[-1].artefacts


def test_codegen_holds_printers_only():
    """kiln.codegen prints kernels and wrappers: it never reaches back into the pipeline, autograd or capture."""
    for path in (KILN / "codegen").rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        for module in modules:
            assert not module.startswith(("kiln.pipeline", "kiln.autograd", "kiln.capture", "kiln.debug")), \
                f"{path.relative_to(KILN)} imports {module}"


def _conv_backward_with_unread_items(grad, x, w):
    """The weight gradient of a convolution without bias; the items it does not read (the input and bias
    gradients, None) are taken out as well, as a traced backward may hold them."""
    out = torch.ops.aten.convolution_backward.default(grad, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                      [False, True, False])
    return out[1] * 2


@pytest.mark.parametrize("unread", [[0, 2], [2], [0]])
def test_items_that_are_none_do_not_retrace_the_graph(unread):
    """make_fx records no `meta['val']` for an item that is None; decompose used to re-trace a whole graph for
    it (DenseNet-121's backward: 121 such items, seconds of re-trace)."""
    grad, x, w = torch.randn(2, 4, 6, 6), torch.randn(2, 3, 6, 6), torch.randn(4, 3, 1, 1)
    gm = trace(_conv_backward_with_unread_items, grad, x, w)
    conv = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution_backward.default)
    with gm.graph.inserting_after(conv):
        for k in unread:
            item = gm.graph.call_function(operator.getitem, (conv, k))
            assert "val" not in item.meta
    gm.recompile()
    assert pipeline.decompose(gm, [grad, x, w]) is gm
    compiled = compile_aten_graph(gm, [grad, x, w])
    torch.testing.assert_close(compiled(grad, x, w)[0], _conv_backward_with_unread_items(grad, x, w))
