"""Shared fixtures: one `python -m kiln run` of two_regions.py (text + HTML report), reused by the CLI tests."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def run_kiln(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    # KILN_GRAPH_CACHE=0: a report shows every stage's time, which a compile served from the cache skips
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "KILN_GRAPH_CACHE": "0", **(env or {})}
    full_env.pop("KILN_DEBUG_DIR", None) if env is None or "KILN_DEBUG_DIR" not in env else None
    return subprocess.run([sys.executable, "-m", "kiln", "run", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def cli_run(tmp_path_factory):
    """(completed process, html path) of `python -m kiln run --report out.html two_regions.py --flag 7`."""
    out = tmp_path_factory.mktemp("cli")
    html = out / "report.html"
    proc = run_kiln(["--report", str(html), str(HERE / "two_regions.py"), "--flag", "7"], cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, html
