"""A hung compiler is killed after `kiln.config.compiler_timeout` seconds: the build raises a clear error and
the graph runs through ATen (a recorded fallback). No kernel compiler outlives the process, and no build's
temporary files stay behind; the guards' tensor checks, built by a detached process that outlives its parent on
purpose, are held to the same time limit there."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import kiln
from kiln.config import config
from kiln.runtime import cache
from support.cache import answer_source, fake_compiler

SLEEPER = 'echo $$ >> "{pids}"\nexec sleep 60'


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1].startswith("Z")  # a zombie is dead; its parent reaps it
    except FileNotFoundError:
        return True


def _wait_dead(pids: list[int], seconds: float = 10) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if all(_dead(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def sleeping_compiler(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv("KILN_CXX", str(fake_compiler(tmp_path / "bin", SLEEPER.format(pids=pids))))
    monkeypatch.setattr(config, "compiler_timeout", 1.0)
    return pids


def test_sleeping_compiler_times_out_and_is_killed(fresh_cache, sleeping_compiler):
    start = time.perf_counter()
    with pytest.raises(cache.CompilerTimeout, match="compiler_timeout"):
        cache.load(answer_source(3))
    assert time.perf_counter() - start < 10
    assert _wait_dead([int(p) for p in sleeping_compiler.read_text().split()])
    leftovers = [p.name for p in (fresh_cache / "cpp").rglob("*") if p.is_file()]
    assert leftovers == []


@pytest.mark.allows_fallback("graph: the C++ compiler hangs and is killed after compiler_timeout")
def test_compiled_function_falls_back_to_aten_when_the_compiler_hangs(fresh_cache, sleeping_compiler,
                                                                      fallback_log):
    def f(x):
        return (x.sin() * 2).sum(-1)

    x = torch.randn(3, 5)
    torch.testing.assert_close(kiln.compile(f)(x), f(x))
    assert fallback_log.counts().get("graph") == 1
    assert "CompilerTimeout" in fallback_log.records()[0].cause
    assert len(sleeping_compiler.read_text().split()) == 1, "no per-kernel retry waits on the compiler again"


EXITING = textwrap.dedent("""
    import sys, time
    from kiln.capture import tensor_checks
    tensor_checks.available()  # starts the extension's build in its detached builder
    while not open(sys.argv[1]).read().strip():
        time.sleep(0.05)
    sys.exit(0)  # exits while the compiler runs
""")


def test_a_hung_build_left_by_an_exited_process_is_killed_and_leaves_no_files(tmp_path):
    """The guards' extension builds in a detached process that outlives its parent (kiln/runtime/detached_build.py):
    a compiler that hangs there is killed at the time limit all the same, and the builder removes its files."""
    pids = tmp_path / "pids"
    pids.write_text("")
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_COMPILER_TIMEOUT="2",
               KILN_CXX=str(fake_compiler(tmp_path / "bin", SLEEPER.format(pids=pids))))
    proc = subprocess.run([sys.executable, "-c", EXITING, str(pids)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _wait_dead([int(p) for p in pids.read_text().split()], seconds=30)
    deadline = time.time() + 10  # the builder removes its temporary files after its compiler is gone
    while [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and not p.name.endswith(".lock")] and \
            time.time() < deadline:
        time.sleep(0.1)
    leftovers = [p.name for p in (tmp_path / "cache").rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert leftovers == []


def test_temporary_files_of_a_killed_process_are_removed_by_the_next_build(fresh_cache):
    """A process killed mid-build (no atexit) leaves its temporary files; the next build in the folder removes
    those whose process is gone, and leaves a live process's alone."""
    source = answer_source(5)
    folder = cache.folder("cpp", cache.source_key(source)[:2])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = folder / f".abc.{dead.pid}.0123abcd.tmp.so"
    live = folder / f".abc.{os.getpid()}.0123abcd.tmp.so"
    orphan.write_bytes(b"half")
    live.write_bytes(b"half")
    cache.build(source)
    assert not orphan.exists() and live.exists()
