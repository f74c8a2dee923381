"""`python -m kiln run script.py args`: the script runs with torch.compile routed to kiln; the report at exit."""
from __future__ import annotations

import re

from tests.debug.conftest import HERE, run_kiln

SCRIPT = str(HERE / "two_regions.py")
BREAK_LINE = next(i for i, line in enumerate(open(SCRIPT), 1) if 'print("graph break here")' in line)


def test_script_runs_with_its_arguments(cli_run):
    proc, _ = cli_run
    assert "script args: ['--flag', '7']" in proc.stdout
    assert proc.stdout.splitlines().count("graph break here") == 3


def test_report_lists_both_regions_with_backend(cli_run):
    out = cli_run[0].stdout
    assert re.search(r"\[1\] scale \(.*two_regions\.py:\d+\)  backend=inductor", out)
    assert re.search(r"\[2\] shift \(.*two_regions\.py:\d+\)  backend=eager", out)
    assert "graphs: 2   ops: 3   graph breaks: 1   recompiles: 0   kernels: 2" in out


def test_report_names_the_break_with_file_and_line(cli_run):
    out = cli_run[0].stdout
    assert "graph break (print) print()" in out
    assert f"two_regions.py:{BREAK_LINE}: print(\"graph break here\")" in out
    assert "hint: " in out


def test_report_shows_the_recompile_with_its_failing_guard(cli_run):
    out = cli_run[0].stdout
    m = re.search(r"recompile of shift .*\(graph \d+\): tensor guard failed on L\['x'\]: "
                  r"shape changed from \[4, 8\] to \[5, 3\]; expected .*shape=\[4, 8\].*"
                  r"got .*shape=\[5, 3\]", out)
    assert m, out


def test_report_splits_compile_time_by_stage_and_counts_kernels(cli_run):
    out = cli_run[0].stdout
    line = next(text for text in out.splitlines()
                if text.strip().startswith("compile time:") and "capture" in text and "build" in text)
    for stage in ("capture", "autograd", "lowering", "codegen", "build"):
        assert f"{stage} " in line
    # descriptive kernel names: sin, then softmax's max/exp/sum fused into one kernel
    assert "graph1/inference: kernel_sin_0" in out or re.search(r"graph\d+/inference: kernel_sin_0", out)
    assert re.search(r"graph\d+/inference: fused_max_exp_sum_0", out)


def test_report_counts_time_in_compiled_code(cli_run):
    out = cli_run[0].stdout
    m = re.search(r"\[1\] scale.*?time in compiled code: ([\d.]+) ms over 3 calls", out, re.S)
    assert m and float(m.group(1)) > 0
    assert re.search(r"graph \d+: scale .*\(2 ops, 1 kernels, compile [\d.]+ s, 3 calls [\d.]+ ms\)", out)


def test_report_prints_captured_graph_code(cli_run):
    out = cli_run[0].stdout
    assert "|     sin = torch.sin(x)" in out
    assert "|     relu = torch.relu(sub)" in out


def test_without_a_script_runs_the_bundled_example(monkeypatch, tmp_path, capsys):
    """`python -m kiln run` alone: the bundled example (here a stand-in, the real one takes ~20 s) and its summary."""
    import torch

    import kiln.__main__ as cli
    from kiln.examples import vit_train

    def tiny_example():
        compiled = torch.compile(lambda x: torch.tanh(x) * 3, backend="eager")
        compiled(torch.randn(4))
        return "eager step: 1.0 ms | compiled step: 0.5 ms | speedup 2.00x"

    monkeypatch.setattr(vit_train, "main", tiny_example)
    original = torch.compile
    assert cli.main(["run", "--report", str(tmp_path / "r.html")]) == 0
    assert torch.compile is original  # restored after the run
    out = capsys.readouterr().out
    assert "kiln report" in out and "speedup 2.00x" in out
    assert re.search(r"\[\d+\] <lambda> .*backend=eager", out)
    assert "speedup 2.00x" in (tmp_path / "r.html").read_text()


def test_torch_spellings_behave_as_under_torch_compile(tmp_path):
    """graph_break splits the graph, disable runs eagerly, is_compiling is True, mark_dynamic avoids recompiles."""
    proc = run_kiln([str(HERE / "dynamo_spellings.py")], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("step matches torch.compile: True") == 3, proc.stdout
    assert proc.stdout.count("scale matches eager: True") == 3, proc.stdout
    assert "graph break (explicit)" in proc.stdout and "graph break (disabled)" in proc.stdout
    # step: before the explicit break and after the disabled call; scale: one graph for three sizes
    assert re.search(r"graphs: 2 .* graph breaks: 2 .* recompiles: 0", proc.stdout), proc.stdout
    assert re.search(r"graphs: 1 .* graph breaks: 0 .* recompiles: 0", proc.stdout), proc.stdout
