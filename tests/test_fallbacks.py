"""kiln/fallbacks.py: every fallback counted by kind, warned once per graph, shown in the report and the debug
directory, and an error naming graph, kernel and cause under KILN_STRICT=1 (which this suite runs with)."""
from __future__ import annotations

import warnings
import zlib

import pytest
import torch

import kiln
from kiln import fallbacks
from kiln.capture.breaks import CATALOGUE
from kiln.debug.report import text_report
from kiln.pipeline import compile_aten_graph
from support.lowering import trace


def graph_that_cannot_lower():
    """An ATen graph kiln refuses as a whole (in-place ops: it expects functional graphs)."""
    x = torch.randn(4)
    return trace(lambda x: x.add_(1), x.clone()), x


def fails_to_capture(monkeypatch):
    import kiln.capture.entry as entry

    def broken(*args, **kwargs):
        raise RuntimeError("injected capture bug")
    monkeypatch.setattr(entry, "capture", broken)


def kiln_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, kiln.KilnFallbackWarning)]


@pytest.mark.allows_fallback("graph: a graph with in-place ops")
def test_graph_fallback_is_counted_and_warned_once(fallback_log):
    gm, x = graph_that_cannot_lower()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = compile_aten_graph(gm, [x])
    y = x.clone()
    compiled(y)
    torch.testing.assert_close(y, x + 1)  # it runs, through ATen
    [f] = fallback_log.records()
    assert (f.kind, f.graph, f.stage) == ("graph", compiled.artefacts["name"], "compile")
    assert "in-place" in f.cause
    assert len(kiln_warnings(caught)) == 1


def test_graph_fallback_is_an_error_under_strict():
    gm, x = graph_that_cannot_lower()
    with pytest.raises(kiln.KilnStrictError, match=r"KILN_STRICT=1: kiln fell back \(graph at compile\) in aten"):
        compile_aten_graph(gm, [x])


@pytest.mark.allows_fallback("frame: capture is broken on purpose")
def test_frame_fallback_warns_once_per_frame(monkeypatch, fallback_log):
    fails_to_capture(monkeypatch)
    c = kiln.compile(lambda x: x * 2, backend="eager")
    x = torch.randn(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(c(x), x * 2)
    assert fallback_log.counts() == {"frame": 3}  # each call tried, and fell back
    [message] = kiln_warnings(caught)
    assert "injected capture bug" in message and "<lambda>" in message


def test_frame_fallback_is_an_error_under_strict(monkeypatch):
    fails_to_capture(monkeypatch)
    c = kiln.compile(lambda x: x * 2, backend="eager")
    with pytest.raises(kiln.KilnStrictError, match="injected capture bug") as e:
        c(torch.randn(3))
    assert e.value.fallback.kind == "frame"


def with_numpy(x):
    return x * float(x.numpy().sum())  # numpy: torch.compile traces it, kiln breaks (at .numpy(), then on the array)


def with_print(x):
    y = x * 2
    print("halfway")  # torch.compile breaks here too
    return y + 1


def with_item(x):
    return x * x.sum().item()


def with_unknown_c_function(x):
    return x * (zlib.crc32(b"kiln") % 7)  # a C function: torch.compile breaks here too


def print_in_try(x):
    try:
        y = with_print(x)  # kiln cannot resume inside `try`: the frame runs eagerly, as torch.compile's does
    finally:
        pass
    return y


def break_in_try(x):
    try:
        y = with_numpy(x)
    finally:
        pass
    return y


def test_every_catalogued_break_reason_is_classified():
    assert set(fallbacks.BREAKS) == set(CATALOGUE)
    assert {r for r, (counts, _) in fallbacks.BREAKS.items() if counts} == {"numpy", "hooks", "unknown_context"}


@pytest.mark.parametrize("fn, reason", [(with_print, "print"), (with_item, "tensor_to_python"),
                                        (with_unknown_c_function, "unsupported_call"), (print_in_try, "print")])
def test_breaks_that_are_not_fallbacks_run_under_strict(fn, reason, fallback_log, capsys):
    c = kiln.compile(fn, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(c(x), fn(x))
    assert fallback_log.counts() == {} and fallback_log.breaks[reason] == 1
    assert f"graph breaks that are not fallbacks: {reason} 1" in fallback_log.summary()


@pytest.mark.parametrize("fn, kind", [(with_numpy, "graph_break"), (break_in_try, "frame")])
def test_shortfall_breaks_are_errors_under_strict(fn, kind, fallback_log):
    c = kiln.compile(fn, backend="eager")
    with pytest.raises(kiln.KilnStrictError, match="numpy") as e:
        c(torch.randn(3))
    assert e.value.fallback.kind == kind


@pytest.mark.allows_fallback("graph_break: a numpy call kiln does not trace")
def test_shortfall_break_is_counted_and_warned(fallback_log):
    c = kiln.compile(with_numpy, backend="eager")
    x = torch.randn(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(c(x), with_numpy(x))
    assert set(fallback_log.counts()) == {"graph_break"}  # .numpy(), then in continuations what reads the array
    assert fallback_log.counts()["graph_break"] > 1
    [message] = kiln_warnings(caught)  # once for the function, its continuation included
    assert "numpy" in message and "with_numpy" in message


@pytest.mark.allows_fallback("frame_limit: one recompile per call past config.cache_size_limit")
def test_cache_size_limit_is_a_fallback(monkeypatch, fallback_log):
    monkeypatch.setattr(kiln.config, "cache_size_limit", 2)
    c = kiln.compile(lambda x, n: x * n, backend="eager", dynamic=False)
    x = torch.randn(3)
    with pytest.warns(kiln.KilnFallbackWarning, match="cache_size_limit"):
        for n in range(4):
            torch.testing.assert_close(c(x, n), x * n)
    assert fallback_log.counts() == {"frame_limit": 1}


@pytest.mark.allows_fallback("graph: a graph with in-place ops")
def test_report_and_debug_directory_show_the_counts(fallback_log, monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    monkeypatch.setattr(kiln.config, "debug_dir", None)  # the variable decides
    gm, x = graph_that_cannot_lower()
    with pytest.warns(kiln.KilnFallbackWarning):
        compile_aten_graph(gm, [x])
    report = text_report([])
    assert "fallbacks: 1  graph 1" in report and "in-place" in report
    assert (tmp_path / "fallbacks.txt").read_text().startswith("fallbacks: 1  graph 1")


@pytest.mark.allows_fallback("graph: a graph with in-place ops")
def test_reset_forgets_counts_and_warns_again(fallback_log):
    for _ in range(2):
        gm, x = graph_that_cannot_lower()
        with pytest.warns(kiln.KilnFallbackWarning):
            compile_aten_graph(gm, [x])
        assert fallback_log.counts() == {"graph": 1}
        kiln.reset()
