"""torch's debugging switches under kiln: TORCH_LOGS topics map onto kiln's logs, TORCH_COMPILE_DEBUG=1 writes the
debug directory, an unknown topic is one warning; KILN_LOGS=output_code shows each graph's kernels and wrapper."""
from __future__ import annotations

import logging

import pytest
import torch

import kiln
from kiln.debug import logs
from tests.debug.conftest import run_kiln

SCRIPT = '''
import torch

def f(x):
    y = torch.sin(x) * 2
    print("graph break here")
    return y.sum(0)

compiled = torch.compile(f)
compiled(torch.randn(4, 4))
compiled(torch.randn(4, 4, dtype=torch.float64))
'''


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("switches") / "user_script.py"
    path.write_text(SCRIPT)
    return path


def test_torch_logs_under_kiln_run(script):
    proc = run_kiln([str(script)], cwd=script.parent,
                    env={"TORCH_LOGS": "graph_breaks,recompiles,guards,output_code,not_a_topic"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr
    assert "[kiln.graph_breaks]" in err and "print" in err
    assert "[kiln.recompiles]" in err and "dtype changed from torch.float32 to torch.float64" in err
    assert "[kiln.guards] guards for f" in err
    assert "[kiln.output_code] output code for graph1/inference: kernels (kernel_sin_mul_0) in kernels.cpp" in err \
        or "[kiln.output_code] output code for graph1/inference" in err
    assert "[kiln.output_code] output code for graph1/inference: wrapper.py" in err
    assert err.count("kiln has no log for 'not_a_topic'") == 1  # one warning, not torch's ValueError
    assert "kiln report" in proc.stdout


def test_torch_compile_debug_writes_the_debug_directory(script, tmp_path):
    proc = run_kiln([str(script)], cwd=tmp_path, env={"TORCH_COMPILE_DEBUG": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    graph = tmp_path / "kiln_debug" / "graph1"
    assert (graph / "captured_graph.py").exists() and (graph / "inference" / "kernels.cpp").exists()
    assert (tmp_path / "kiln_debug" / "index.md").exists()


@pytest.mark.parametrize("torch_spec, kiln_spec", [
    ("graph_breaks,recompiles", "graph_breaks,recompiles"),
    ("graph_code,aot_graphs,output_code", "graph,aot,output_code"),
    ("+dynamo", "+capture,+graph_breaks,+recompiles"),
    ("-dynamo,guards", "guards"),
    ("kernel_code,recompiles_verbose", "output_code,recompiles"),
])
def test_torch_topics_map_onto_kiln_topics(torch_spec, kiln_spec):
    assert logs.from_torch_logs(torch_spec) == (kiln_spec, [])


def test_unknown_torch_topics_are_listed_not_raised():
    assert logs.from_torch_logs("graph_breaks,fusion,bogus") == ("graph_breaks", ["fusion", "bogus"])


def test_configure_warns_once_for_unknown_topics(monkeypatch):
    monkeypatch.delenv("KILN_LOGS", raising=False)
    monkeypatch.setenv("TORCH_LOGS", "recompiles,bogus,other")
    monkeypatch.setattr("kiln.torch_switches._torch_logs", None)
    try:
        with pytest.warns(UserWarning, match="kiln has no log for 'bogus', 'other'") as caught:
            assert logs.configure_from_environment() == ["recompiles"]
        assert len(caught) == 1
    finally:
        logs.set_logs(None)


def test_output_code_logs_every_kernel_and_the_wrapper_with_the_graph_name(caplog):
    model = kiln.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()))
    with caplog.at_level(logging.INFO, logger="kiln.output_code"):
        model(torch.randn(2, 4)).sum().backward()
    messages = [r.getMessage() for r in caplog.records if r.name == "kiln.output_code"]
    for kind in ("forward", "backward"):
        kernels = [m for m in messages if f"/{kind}: kernels (" in m]
        wrappers = [m for m in messages if f"/{kind}: wrapper.py" in m]
        assert len(kernels) == 1 and len(wrappers) == 1, messages
        assert "def call(" in wrappers[0]
    forward = next(m for m in messages if "/forward: kernels (" in m)
    names = forward.split("kernels (", 1)[1].split(")", 1)[0].split(", ")
    assert all(f'extern "C" void {name}(' in forward for name in names)
