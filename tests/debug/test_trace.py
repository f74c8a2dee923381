"""The debug directory: one predictable layout per captured graph, with an index."""
from __future__ import annotations

import json

import torch

import kiln
from kiln.api import context_of
from kiln.pipeline import STAGES


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x)).softmax(-1)


GRAPH_FILES = {"summary.txt", "captured_graph.py", "output_program.py", "guards.txt", "timings.json"}
CODEGEN_FILES = {"aten_graph.py", "ir.txt", "schedule.txt", "memory.txt", "kernels.cpp", "wrapper.py", "times.json"}


def test_trace_enabled_writes_every_stage_per_graph(tmp_path, monkeypatch):
    monkeypatch.setattr(kiln.config, "debug_dir", str(tmp_path))
    monkeypatch.delenv("KILN_DEBUG_DIR", raising=False)
    model = kiln.compile(Net(), options={"trace.enabled": True, "trace.graph_diagram": True})
    model(torch.randn(4, 8)).sum().backward()
    gid = context_of(model).records[0].id
    g = tmp_path / f"graph{gid}"
    assert GRAPH_FILES | {"captured_graph.svg"} <= {p.name for p in g.iterdir()}
    assert "def forward" in (g / "captured_graph.py").read_text()
    program = (g / "output_program.py").read_text()
    assert "def guard(L, G, C)" in program and "def program(L, G, C)" in program
    assert {"capture", "autograd", "lowering", "codegen", "build"} <= set(json.loads((g / "timings.json").read_text()))
    aot = sorted(p.name for p in (g / "aot").iterdir())
    assert [name.split("_", 1)[1] for name in aot] == ["trace_joint.py", "joint.py", "forward.py", "backward.py"]
    for kind in ("forward", "backward"):
        files = {p.name for p in (g / kind).iterdir()}
        assert CODEGEN_FILES | {"fused_graph.svg"} <= files, (kind, files)
        assert set(json.loads((g / kind / "times.json").read_text())) == set(STAGES)
    assert "kernel" in (g / "forward" / "schedule.txt").read_text()
    index = (tmp_path / "index.md").read_text()
    assert f"## graph{gid}: graph {gid}: forward" in index
    assert f"[graph{gid}/forward/kernels.cpp](graph{gid}/forward/kernels.cpp) — generated C++ kernels" in index
    assert f"graph{gid}/aot/" in index and "loop-level IR before fusion" in index


def test_env_var_alone_turns_the_directory_on_for_any_backend(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    monkeypatch.setattr(kiln.config, "debug_dir", None)  # the variable decides
    monkeypatch.setattr(kiln.config, "debug_dir", None)

    def f(x):
        y = x.cos()
        kiln.graph_break()
        return y + 1

    compiled = kiln.compile(f, backend="eager")
    compiled(torch.randn(3))
    ids = [r.id for r in context_of(compiled).records]
    assert len(ids) == 2
    for gid in ids:
        assert GRAPH_FILES <= {p.name for p in (tmp_path / f"graph{gid}").iterdir()}
    assert "graph break" in (tmp_path / f"graph{ids[0]}" / "summary.txt").read_text()
    assert "captured_graph.svg" not in {p.name for p in (tmp_path / f"graph{ids[0]}").iterdir()}  # diagrams off


def test_nothing_written_without_the_option_or_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_DEBUG_DIR", raising=False)
    monkeypatch.setattr(kiln.config, "debug_dir", str(tmp_path))
    kiln.compile(lambda x: x * 3)(torch.randn(3))
    assert not any(tmp_path.iterdir())


def test_index_lists_only_this_runs_files_and_no_symlink_is_written_through(tmp_path, monkeypatch):
    """Files an earlier run left are not listed; a symlink planted at a file's path (index.md) is replaced, the
    file it points to untouched; the folders are private."""
    root = tmp_path / "debug"
    stale = root / "graph99999"
    stale.mkdir(parents=True)
    (stale / "summary.txt").write_text("graph 99999: from an earlier run\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (root / "index.md").symlink_to(victim)
    root.chmod(0o700)
    monkeypatch.setattr(kiln.config, "debug_dir", str(root))
    monkeypatch.delenv("KILN_DEBUG_DIR", raising=False)
    model = kiln.compile(Net(), options={"trace.enabled": True})
    model(torch.randn(4, 8))
    gid = context_of(model).records[0].id
    index = (root / "index.md").read_text()
    assert f"## graph{gid}:" in index and "graph99999" not in index
    assert victim.read_text() == "precious\n" and not (root / "index.md").is_symlink()
    assert (root / f"graph{gid}").stat().st_mode & 0o777 == 0o700
