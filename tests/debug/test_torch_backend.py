"""`torch.compile(model, backend="kiln")`: torch's capture, kiln's code generator, mode and options passed through.

torch finds backends by name through the `torch_dynamo_backends` entry-point group. This checkout may not be
the installed one (the editable install can point at another tree), so the tests read the entry point from
pyproject.toml, check that it names the backend function, and register it with torch under its name in-process,
as torch does on discovery. Where this tree is the installed one, the installed metadata must say the same.
`KILN_TEST_FRESH_INSTALL=1` also installs this tree into a temporary prefix and compiles through it by name.
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend, register_backend

import kiln
from kiln.backends import torch_compile_backend

ROOT = Path(__file__).resolve().parents[2]


def declared_entry_point() -> importlib.metadata.EntryPoint:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    value = project["entry-points"]["torch_dynamo_backends"]["kiln"]
    return importlib.metadata.EntryPoint(name="kiln", value=value, group="torch_dynamo_backends")


@pytest.fixture(scope="module", autouse=True)
def kiln_backend_registered():
    """What torch's registry does when it discovers the entry point: the name maps to the loaded target."""
    try:
        lookup_backend("kiln")
    except Exception:  # not installed from this tree: register it the way discovery would
        register_backend(name="kiln", compiler_fn=declared_entry_point().load())


def test_entry_point_names_the_backend_function():
    assert declared_entry_point().load() is torch_compile_backend


def test_installed_metadata_matches_when_installed_from_this_tree():
    installed = [ep for ep in importlib.metadata.entry_points(group="torch_dynamo_backends") if ep.name == "kiln"]
    if not installed:
        pytest.skip("the installed kiln (the editable install of another tree) predates the entry point")
    assert installed[0].value == declared_entry_point().value


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x)).softmax(-1)


def test_backend_kiln_runs_kilns_code_generator_forward_and_backward(compiled_graphs):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(4, 8)
    compiled = torch.compile(model, backend="kiln")
    actual = compiled(x)
    actual.sum().backward()
    expected = model(x)
    torch.testing.assert_close(actual, expected)
    kinds = [g.artefacts["name"] for g in compiled_graphs]
    assert len(kinds) == 2 and all(g.num_kernels > 0 for g in compiled_graphs), kinds  # forward and backward


def test_options_reach_kilns_backend(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "debug_dir", str(tmp_path))
    monkeypatch.delenv("KILN_DEBUG_DIR", raising=False)
    compiled = torch.compile(lambda x: torch.cos(x) + 1, backend="kiln", options={"trace.enabled": True})
    compiled(torch.randn(5))
    written = [p.name for p in tmp_path.rglob("kernels.cpp")]
    assert written, list(tmp_path.rglob("*"))


def test_mode_reaches_kilns_backend(monkeypatch):
    seen = []
    original = kiln.backends.inductor
    monkeypatch.setattr(kiln.backends, "inductor", lambda gm, inputs, options: seen.append(options) or
                        original(gm, inputs, options))
    torch.compile(lambda x: x * 3, backend="kiln", mode="max-autotune-no-cudagraphs")(torch.randn(3))
    assert seen and seen[0].max_autotune and not seen[0].triton_cudagraphs


def test_an_unknown_option_is_named():
    compiled = torch.compile(lambda x: x * 3, backend="kiln", options={"not_an_option": 1})
    with pytest.raises(Exception, match="unknown option 'not_an_option'"):
        compiled(torch.randn(3))


@pytest.mark.skipif(os.environ.get("KILN_TEST_FRESH_INSTALL") != "1",
                    reason="installs kiln into a temporary prefix (~15 s): KILN_TEST_FRESH_INSTALL=1 runs it")
def test_fresh_install_registers_backend_kiln_with_torch(tmp_path):
    """`pip install` of this tree (a copy, so no build/ is left here), then, in a fresh process that imports
    only torch, `torch.compile(model, backend="kiln")`: torch finds kiln through the installed entry point."""
    source = tmp_path / "src"
    shutil.copytree(ROOT / "kiln", source / "kiln", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source)
    prefix = tmp_path / "prefix"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--prefix", str(prefix), str(source)], check=True, capture_output=True, timeout=300)
    site = next(prefix.glob("lib/python*/site-packages"))
    program = ("import torch\n"
               "m = torch.nn.Linear(4, 4)\n"
               "x = torch.randn(3, 4)\n"
               "y = torch.compile(m, backend='kiln', options={'epilogue_fusion': False})(x)\n"
               "torch.testing.assert_close(y, m(x))\n"
               "import kiln, sys\n"
               "print(kiln.__file__, len(kiln.pipeline._names_used))\n")
    proc = subprocess.run([sys.executable, "-c", program], env={**os.environ, "PYTHONPATH": str(site)},
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where, graphs = proc.stdout.split()
    assert where.startswith(str(site)) and int(graphs) >= 1  # the installed kiln compiled the graph
