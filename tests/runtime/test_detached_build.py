"""The guards' C++ extension is built by a detached process (kiln/runtime/detached_build.py): a process that exits
before the build is done leaves it to finish, and the next process loads the library at once instead of starting
the build again. Concurrent builders of one cache build it once.

The compiler here is a stand-in that waits a little and then copies the real extension (built once for the test
session), so that each test takes seconds and what it publishes really loads.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kiln.capture import tensor_checks
from kiln.runtime.private_files import verify
from support.cache import fake_compiler

# a compiler that notes each run, takes `delay` seconds, and writes the real extension where -o says
COPYING = textwrap.dedent("""\
    echo run >> "{runs}"
    while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done
    sleep {delay}
    cp "{library}" "$out"
""")

# one process: starts the build (or loads the library) and reports; with "wait", waits for the build first
PROCESS = textwrap.dedent("""
    import json, sys
    from kiln.capture import tensor_checks
    module = tensor_checks.wait() if sys.argv[1] == "wait" else tensor_checks.available()
    print(json.dumps({"loaded": module is not None, "built_here": tensor_checks._build_thread is not None}))
""")


@pytest.fixture
def copying_compiler(tmp_path):
    """(environment for processes over an empty cache whose compiler copies the real extension, its runs file)."""
    module = tensor_checks.wait()
    if module is None:
        pytest.skip("the C++ tensor checks cannot be built here")
    runs = tmp_path / "runs"
    runs.write_text("")

    def env(delay: float) -> dict:
        script = fake_compiler(tmp_path / f"bin{delay}", COPYING.format(runs=runs, delay=delay,
                                                                        library=module.__file__))
        return dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_CXX=str(script))
    return env, runs


def _start(env: dict, how: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PROCESS, how], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _library(env: dict, monkeypatch) -> Path:
    """Where processes with `env` look for the extension (its path depends on the cache directory and compiler)."""
    monkeypatch.setenv("KILN_CACHE_DIR", env["KILN_CACHE_DIR"])
    monkeypatch.setenv("KILN_CXX", env["KILN_CXX"])
    return tensor_checks._library_path()


def test_a_short_process_leaves_the_build_to_finish_and_the_next_one_loads_it(copying_compiler, monkeypatch):
    env, runs = copying_compiler
    env = env(delay=2)
    first = _result(_start(env, "available"))  # exits while the compiler still runs
    assert first == {"loaded": False, "built_here": True}
    library = _library(env, monkeypatch)
    deadline = time.time() + 60
    while verify(library) is not None and time.time() < deadline:
        time.sleep(0.1)
    assert verify(library) is None, "the builder published the library after its process exited"
    second = _result(_start(env, "available"))
    assert second == {"loaded": True, "built_here": False}
    assert runs.read_text().split() == ["run"]


def test_processes_starting_together_build_the_extension_once(copying_compiler, monkeypatch):
    env, runs = copying_compiler
    env = env(delay=1)
    procs = [_start(env, "wait") for _ in range(3)]
    results = [_result(p) for p in procs]
    assert all(r["loaded"] for r in results), results
    assert runs.read_text().split() == ["run"], "the later builders found the first's library"
    leftovers = sorted(p.name for p in _library(env, monkeypatch).parent.iterdir())
    assert [n for n in leftovers if ".tmp" in n] == []


def test_a_failed_build_says_why_and_leaves_the_python_checks(tmp_path):
    """A compiler error in the detached builder reaches this process's log line; the guards stay in Python."""
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"),
               KILN_CXX=str(fake_compiler(tmp_path / "bin", "echo 'no such header' >&2; exit 1")))
    proc = subprocess.run([sys.executable, "-c", "import logging; logging.basicConfig(level=logging.INFO)\n"
                           "from kiln.capture import tensor_checks\nprint(tensor_checks.wait())"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "None"
    assert "tensor guards stay in Python" in proc.stderr and "no such header" in proc.stderr
