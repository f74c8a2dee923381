"""The minifier: a failing graph shrunk to at most 3 nodes, written as a script that shows the failure on its own.

The failures are real ones, made on purpose: a code generator bug injected by a test-only switch
(tests/debug/miscompile.py: kiln's lowering of mul computes an add), and a user's backend that raises on relu
(tests/debug/crashing_backend.py). Each written script is run in a fresh process, with and without the bug.
"""
from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kiln
from kiln.debug.minifier import script
from tests.debug import miscompile
from tests.debug.conftest import ROOT
from tests.debug.crashing_backend import relu_hater

pytestmark = pytest.mark.allows_fallback("graph: the injected sigmoid bug makes a graph fall back on purpose")


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.lin(x)).softmax(-1)
        return (h * x.sigmoid()).sum(0), x.cos() + 1


def relu_program(x, y):
    a = torch.sin(x) + y
    b = torch.relu(a) * 2
    return (b @ y.t()).sum(-1), a.cos()


@pytest.fixture
def repro_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "debug_dir", str(tmp_path))
    for name in ("KILN_REPRO_AFTER", "KILN_REPRO_LEVEL", "TORCHDYNAMO_REPRO_AFTER", "TORCHDYNAMO_REPRO_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "minifier"


def run_script(path: Path, switch: str | None = None) -> subprocess.CompletedProcess:
    """Run a written repro in a fresh process, with one of tests/debug/miscompile.py's bugs switched on."""
    args = ["-m", "tests.debug.miscompile", switch, str(path)] if switch else [str(path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def run_here(path: Path, monkeypatch, capsys) -> tuple[int, str]:
    """Run a written repro in this process (cheaper than a fresh one): its exit status and what it printed."""
    monkeypatch.setenv("KILN_STRICT", "1")  # set by the script; restored after the test
    monkeypatch.setenv("KILN_REPRO_LEVEL", "0")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(str(path), run_name="__main__")
    return exited.value.code, capsys.readouterr().out


def compute_nodes(path: Path) -> int:
    repro, _ = script.load(path)
    return repro.case.size[0]


@pytest.mark.parametrize("after", ["aot", "capture"])
def test_injected_codegen_bug_is_minified_to_a_script_that_shows_it(after, repro_dir, monkeypatch, capsys):
    monkeypatch.setenv("KILN_REPRO_AFTER", after)
    monkeypatch.setenv("KILN_REPRO_LEVEL", "3")
    with miscompile.mul_as_add(), pytest.raises(kiln.BackendCompilerFailed, match="differs|accuracy") as raised:
        kiln.compile(Block())(torch.randn(4, 8))
    message = str(raised.value)
    minified = next(repro_dir.glob(f"*_{after}_minified.py"))
    assert str(minified) in message and "minified to" in message
    assert compute_nodes(minified) <= 3
    assert "mul" in minified.read_text()  # the miscompiled op (gelu and tanh decompose to muls, sigmoid does not)
    assert "[kiln minifier]" in capsys.readouterr().err  # progress, step by step

    if after == "aot":  # standalone: a fresh process with the bug shows it
        broken = run_script(minified, "mul_as_add")
        assert broken.returncode == 1 and "MISMATCH: kiln differs from eager" in broken.stdout, broken.stdout
    else:
        with miscompile.mul_as_add():
            code, out = run_here(minified, monkeypatch, capsys)
        assert code == 1 and "MISMATCH: kiln differs from eager" in out, out
    code, out = run_here(minified, monkeypatch, capsys)  # without the bug, kiln agrees with eager
    assert code == 0 and "OK" in out, out


def test_crashing_backend_raises_and_writes_a_minified_repro(repro_dir, monkeypatch):
    monkeypatch.setenv("KILN_REPRO_AFTER", "capture")  # level 2 (the default): minify crashes
    with pytest.raises(kiln.BackendCompilerFailed, match="relu is not supported") as raised:
        kiln.compile(relu_program, backend=relu_hater)(torch.randn(8, 8), torch.randn(8, 8))
    minified = next(repro_dir.glob("*_capture_minified.py"))
    whole = minified.with_name(minified.name.replace("_minified", ""))
    assert f"kiln repro of the whole graph: {whole}" in str(raised.value)
    assert compute_nodes(minified) <= 3 < compute_nodes(whole)
    assert "torch.relu" in minified.read_text() and "from tests.debug.crashing_backend import" in minified.read_text()
    shown = run_script(minified)
    assert shown.returncode == 1 and "NotImplementedError: relu is not supported" in shown.stdout, shown.stdout
    assert not minified.with_suffix(".pt").exists()  # random inputs show it: no saved values


def test_a_crashing_backend_writes_the_whole_graph_without_any_switch(repro_dir):
    with pytest.raises(kiln.BackendCompilerFailed) as raised:
        kiln.compile(relu_program, backend=relu_hater)(torch.randn(8, 8), torch.randn(8, 8))
    (written,) = repro_dir.iterdir()  # the whole graph, not minified (no switch asked for it)
    assert written.name.endswith("_capture.py") and f"python -m kiln minify {written}" in str(raised.value)


def test_torch_spelling_of_the_switches(repro_dir, monkeypatch):
    monkeypatch.setenv("TORCHDYNAMO_REPRO_AFTER", "dynamo")
    monkeypatch.setenv("TORCHDYNAMO_REPRO_LEVEL", "2")
    with pytest.raises(kiln.BackendCompilerFailed, match="minified to 1 node"):
        kiln.compile(relu_program, backend=relu_hater)(torch.randn(8, 8), torch.randn(8, 8))


def test_python_m_kiln_minify_shrinks_a_written_repro(repro_dir, tmp_path):
    with pytest.raises(kiln.BackendCompilerFailed):
        kiln.compile(relu_program, backend=relu_hater)(torch.randn(8, 8), torch.randn(8, 8))
    whole = next(repro_dir.glob("*_capture.py"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "kiln", "minify", str(whole), "--timeout", "120"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "truncate:" in proc.stderr and "wrote" in proc.stderr
    assert compute_nodes(whole.with_name(f"{whole.stem}_minified.py")) <= 3


def test_time_limit_gives_up_cleanly_with_the_smallest_graph_so_far(repro_dir, monkeypatch, capsys):
    monkeypatch.setenv("KILN_REPRO_AFTER", "capture")
    monkeypatch.setenv("KILN_REPRO_TIMEOUT", "0")
    with pytest.raises(kiln.BackendCompilerFailed, match=r"partly minified \(time limit 0 s\)"):
        kiln.compile(relu_program, backend=relu_hater)(torch.randn(8, 8), torch.randn(8, 8))
    code, out = run_here(next(repro_dir.glob("*_capture_minified.py")), monkeypatch, capsys)
    assert code == 1 and "relu is not supported" in out  # still a failing script


def test_a_graph_that_falls_back_after_aot_is_minified_and_the_program_goes_on(repro_dir, monkeypatch, capsys):
    monkeypatch.setenv("KILN_REPRO_AFTER", "aot")
    monkeypatch.setenv("KILN_STRICT", "0")
    model = Block()
    x = torch.randn(4, 8)
    with miscompile.sigmoid_raises(), pytest.warns(UserWarning, match="minified to 1 node"):
        actual = kiln.compile(model)(x)
    torch.testing.assert_close(actual, model(x))  # through ATen: right, only slower
    minified = next(repro_dir.glob("*_aot_minified.py"))
    assert "aten.sigmoid" in minified.read_text() and compute_nodes(minified) == 1
    with miscompile.sigmoid_raises():
        code, out = run_here(minified, monkeypatch, capsys)
    assert code == 1 and "injected: the sigmoid lowering is broken" in out, out


def test_a_repro_that_cannot_be_written_leaves_the_error_as_it_was(tmp_path, monkeypatch):
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    monkeypatch.setattr(kiln.config, "debug_dir", str(blocked))  # <debug dir>/minifier cannot be made
    with pytest.raises(kiln.BackendCompilerFailed, match="relu is not supported") as raised:
        kiln.compile(relu_program, backend=relu_hater)(torch.randn(8, 8), torch.randn(8, 8))
    assert "kiln could not write a repro of graph" in str(raised.value)


@pytest.mark.parametrize("after", ["aot", "capture"])
def test_level_3_without_a_bug_writes_nothing_and_warns_nothing(after, repro_dir, monkeypatch, recwarn):
    monkeypatch.setenv("KILN_REPRO_AFTER", after)
    monkeypatch.setenv("KILN_REPRO_LEVEL", "3")
    model, x = Block(), torch.randn(4, 8)
    torch.testing.assert_close(kiln.compile(model)(x), model(x))
    assert not repro_dir.exists() and not [w for w in recwarn if "repro" in str(w.message)]


def test_a_graph_that_falls_back_is_minified_after_capture_too(repro_dir, monkeypatch):
    monkeypatch.setenv("KILN_REPRO_AFTER", "capture")
    monkeypatch.setenv("KILN_STRICT", "0")
    model, x = Block(), torch.randn(4, 8)
    with miscompile.sigmoid_raises(), pytest.warns(UserWarning, match="minified to 1 node"):
        torch.testing.assert_close(kiln.compile(model)(x), model(x))
    assert "sigmoid" in next(repro_dir.glob("*_capture_minified.py")).read_text()


def rounding_program(x):
    return torch.relu(x[:round(x.shape[0] / 2)])  # `round` of a symbolic size: a builtin the graph's code names


def test_a_repro_imports_the_functions_its_graph_names(repro_dir, monkeypatch, capsys):
    """A graph over symbolic sizes calls Python builtins (`round`), which the script imports by module: the
    whole graph's script is written, and shows the failure (it raised a NameError before it was)."""
    with pytest.raises(kiln.BackendCompilerFailed) as raised:
        kiln.compile(rounding_program, backend=relu_hater, dynamic=True)(torch.randn(8, 8))
    assert "could not write a repro" not in str(raised.value)
    (written,) = repro_dir.iterdir()
    assert "importlib.import_module('builtins').round" in written.read_text()
    status, shown = run_here(written, monkeypatch, capsys)
    assert status == 1 and "NotImplementedError: relu is not supported" in shown, shown
