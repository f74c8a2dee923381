"""Accuracy debugging: a deliberately wrong kernel is found, down to the node; a standalone repro is written."""
from __future__ import annotations

import operator
import subprocess
import sys
import warnings

import pytest
import torch

import kiln
import kiln.debug
from kiln.debug import accuracy
from tests.debug.conftest import ROOT


def model(x, w):
    h = torch.matmul(x, w)
    a = torch.sigmoid(h)
    b = a * h + 1
    return b.sum(-1), b


def perturb_sigmoid(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Test only: multiply the sigmoid's output by 1.5 (what a wrong kernel would do)."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.sigmoid:
            with gm.graph.inserting_after(node):
                wrong = gm.graph.call_function(operator.mul, (node, 1.5))
            node.replace_all_uses_with(wrong, delete_user_cb=lambda user, wrong=wrong: user is not wrong)
    gm.recompile()
    return gm


def wrong_inductor(gm, example_inputs):
    """A test-only backend: kiln's inductor compiling a graph with one node perturbed."""
    return kiln.inductor(perturb_sigmoid(gm), example_inputs)


@pytest.fixture(autouse=True)
def _fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "debug_dir", str(tmp_path))
    accuracy.failures.clear()


def test_wrong_kernel_is_found_to_the_node_and_a_repro_is_written(tmp_path):
    compiled = kiln.compile(model, backend=kiln.debug.check_accuracy(wrong_inductor))
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with pytest.warns(UserWarning, match="differs from eager"):
        compiled(x, w)
    assert len(accuracy.failures) == 1
    failure = accuracy.failures[0]
    assert failure.graph.startswith("graph ") and "model" in failure.graph
    assert failure.node is not None and "sigmoid" in failure.node
    assert failure.max_abs_error > 1e-2
    # the standalone repro runs (here with the eager backend, which agrees with eager)
    assert failure.repro is not None and failure.repro.parent == tmp_path / "repro"
    proc = subprocess.run([sys.executable, str(failure.repro), "--backend", "eager"], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "output 0: max abs error" in proc.stdout and "MISMATCH" not in proc.stdout


def test_check_accuracy_option_on_kiln_inductor_finds_nothing_on_a_correct_graph():
    compiled = kiln.compile(model, options={"check_accuracy": True})
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = compiled(x, w)
    torch.testing.assert_close(out, model(x, w))
    assert accuracy.failures == []


def test_first_divergent_node_is_none_for_a_faithful_backend():
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = make_fx(model)(x, w)
    assert accuracy.first_divergent_node(gm, [x, w], lambda g, inputs: g) is None
