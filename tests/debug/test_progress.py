"""Progress bars: drawn for compiles on a terminal, never when output is not a terminal."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

import pytest

from tests.debug.conftest import ROOT

SCRIPT = """
import torch, kiln
kiln.config.progress_delay = 0.0  # draw at once (the default waits a second: short compiles stay silent)
f = kiln.compile(lambda x: (x.exp() + 1).softmax(-1))
f(torch.randn(6, 10))
print("done")
"""


def _run(tty: bool) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"}
    env.pop("KILN_DEBUG_DIR", None)
    if not tty:
        proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout + proc.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 180)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    proc.wait(timeout=180)
    os.close(master)
    assert proc.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_progress_bar_on_a_terminal():
    pytest.importorskip("tqdm", reason="the bar is drawn where tqdm is installed (an optional dependency)")
    out = _run(tty=True)
    assert "done" in out
    assert "kiln graph" in out and "/inference" in out  # the bar names the graph being compiled
    assert "/6" in out  # six stages: decompose, lower, schedule, plan memory, generate, build
    assert "[autograd]" in out and "/inference [decompose]" in out  # the captured graph's bar, then its ATen graph's


def test_no_progress_bar_when_not_a_terminal():
    out = _run(tty=False)
    assert "done" in out
    assert "kiln graph" not in out and "/6" not in out and "\r" not in out
