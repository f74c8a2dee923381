"""Messages that say enough: a recompile names the tensor field that changed; one graph break is counted once."""
from __future__ import annotations

import logging
import re

import pytest
import torch

import kiln
from kiln import fallbacks
from kiln.api import context_of
from kiln.debug.report import text_report


def _recompile_reason(first: torch.Tensor, second: torch.Tensor, dynamic: bool | None = False) -> str:
    compiled = kiln.compile(lambda x: x * 2, backend="eager", dynamic=dynamic)
    compiled(first)
    compiled(second)
    return context_of(compiled).records[-1].recompile_reason


@pytest.mark.parametrize("change, second, named", [
    ("dtype", lambda x: x.double(), "dtype changed from torch.float32 to torch.float64"),
    ("stride", lambda x: x.t(), "stride changed from [4, 1] to [1, 4]"),
    ("requires_grad", lambda x: x.clone().requires_grad_(), "requires_grad changed from False to True"),
    ("device", lambda x: x.to("meta"), "device changed from cpu to meta"),
    ("shape", lambda x: x[:2], "shape changed from [4, 4] to [2, 4]"),
    ("type", lambda x: torch.nn.Parameter(x.clone(), requires_grad=False), "type changed from Tensor to Parameter"),
])
def test_recompile_names_the_field_that_changed(change, second, named):
    x = torch.randn(4, 4)
    reason = _recompile_reason(x, second(x))
    assert named in reason, reason
    others = {"dtype", "device", "stride", "requires_grad", "shape", "type"} - {change}
    assert not any(re.search(rf"\b{other} changed", reason) for other in others), reason
    assert "expected Tensor(" in reason  # both descriptions are still there


def test_recompile_names_two_fields_when_two_changed():
    x = torch.randn(4, 4)
    reason = _recompile_reason(x, x.t().double())
    assert "dtype changed from torch.float32 to torch.float64; stride changed from [4, 1] to [1, 4]" in reason


def test_a_dynamic_dimension_is_not_a_change():
    reason = _recompile_reason(torch.randn(4, 5), torch.randn(3, 6).double(), dynamic=True)
    assert "dtype changed" in reason and "shape changed" not in reason, reason


def test_recompile_log_names_the_field(caplog):
    with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
        _recompile_reason(torch.randn(3), torch.randn(3, dtype=torch.float16))
    assert "dtype changed from torch.float32 to torch.float16" in caplog.text


def _print_twice_compiled():
    def f(x):
        y = x + 1
        print("one print")
        return y * 2

    compiled = kiln.compile(f, backend="eager")
    compiled(torch.randn(3))
    compiled(torch.randn(3))
    compiled(torch.randn(3, dtype=torch.float64))  # a recompile captures the same print again
    return compiled


def test_report_counts_one_print_as_one_break():
    fallbacks.reset()
    compiled = _print_twice_compiled()
    report = text_report([context_of(compiled)])
    assert "graph breaks: 1   recompiles: 2" in report, report
    assert report.count("graph break (print)") == 1
    assert "graph breaks that are not fallbacks: print 1" in report


def test_report_prints_the_summary_line_once(monkeypatch, capsys):
    import kiln.__main__ as cli
    from kiln.examples import vit_train

    summary = "eager step: 1.0 ms | compiled step: 0.5 ms | speedup 2.00x"

    def tiny_example():  # what the real example returns (it no longer prints it itself)
        torch.compile(lambda x: x * 3, backend="eager")(torch.randn(4))
        return summary

    monkeypatch.setattr(vit_train, "main", tiny_example)
    assert cli.main(["run"]) == 0
    assert capsys.readouterr().out.count("speedup 2.00x") == 1
