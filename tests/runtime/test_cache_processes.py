"""The on-disk build cache across processes: a second process compiling the same graph never starts the
compiler, and processes building at the same instant all end with a correct library."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.cache import seed_guard_extension

SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from support.lowering import check
    from kiln.runtime import cache
    x = torch.randn(5, 17)
    check(lambda x: (x.exp() - x.amax(-1, keepdim=True)).sum(-1), x)
    print("compiles", cache.stats["compiles"], "disk_hits", cache.stats["disk_hits"])
""")


def _run(tmp_path: Path, path_prefix: str = "") -> str:
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_CXX="g++")
    env["PATH"] = path_prefix + env["PATH"]
    tests = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=tests)], env=env, capture_output=True,
                          text=True, cwd=str(Path(tests).parent), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_second_process_does_not_compile(tmp_path):
    first = _run(tmp_path)
    assert first == "compiles 1 disk_hits 0"
    # the second process finds a g++ that records being called and fails: calling it fails the run
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "g++").write_text(f"#!/bin/sh\ntouch {tmp_path / 'called'}\nexit 1\n")
    (fake / "g++").chmod(0o755)
    second = _run(tmp_path, f"{fake}{os.pathsep}")
    assert second == "compiles 0 disk_hits 1", second
    assert not (tmp_path / "called").exists()
    assert list((tmp_path / "cache" / "cpp").rglob("*.so"))


# The start line of the racing processes: each says it is ready and blocks on its stdin (no CPU taken from the
# others still starting) until the test releases them all at once (`_released_together`).
AT_THE_LINE = "print('ready', flush=True)\nsys.stdin.readline()\n"

RACE_SCRIPT = """import ctypes, sys
from kiln.runtime import cache
""" + AT_THE_LINE + """lib = cache.build('extern "C" int kiln_race_answer(void) {{ return {value}; }}')
print(ctypes.CDLL(str(lib)).kiln_race_answer())
"""


def _released_together(script: str, env: dict, count: int) -> list[tuple[int, str, str]]:
    """Run `count` processes of `script`, released from AT_THE_LINE at once when all have reached it: (exit code,
    what it printed after the line, its stderr) of each."""
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(count)]
    for p in procs:
        p.stdout.readline()  # "ready", or "" from a process that failed before the line (its code says so)
    for p in procs:
        try:
            p.stdin.write("go\n")
            p.stdin.flush()
        except BrokenPipeError:  # it exited before the line: its code and stderr say why
            pass
    results = [p.communicate(timeout=300) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, results)]


def test_processes_building_one_key_at_once_all_load_it(tmp_path):
    """Same-instant builds of one source: each compiles its own copy of the source, the renames publish one
    library, and every process loads a complete one (none compiles a file another is rewriting)."""
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_CXX="g++")
    for code, out, err in _released_together(RACE_SCRIPT.format(value=4242), env, 3):
        assert code == 0, err[-2000:]
        assert out.strip() == "4242"
    folder = next((tmp_path / "cache" / "cpp").iterdir())
    names = sorted(f.name.split(".", 1)[1] for f in folder.iterdir())
    assert names == ["cpp", "so", "so.manifest.json"], f"temporary files were left behind: {names}"


COMPILE_SCRIPT = """import sys, torch, kiln
def f(x, y):
    return (x.exp() * y).softmax(-1) + x.amax(-1, keepdim=True)
x, y = torch.randn(6, 33), torch.randn(6, 33)
""" + AT_THE_LINE + """torch.testing.assert_close(kiln.compile(f)(x, y), f(x, y))
print("ok")
"""


def test_processes_compiling_one_function_on_a_cold_cache_are_both_correct(tmp_path):
    """Whole compiles racing on an empty cache (strict: a fallback would fail the run) both end correct, with
    one library published and no temporary file left."""
    seed_guard_extension(tmp_path / "cache")
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_CXX="g++", KILN_STRICT="1",
               OMP_NUM_THREADS="1")
    for code, out, err in _released_together(COMPILE_SCRIPT, env, 2):
        assert code == 0 and out.strip() == "ok", err[-3000:]
    libs = list((tmp_path / "cache" / "cpp").rglob("*.so"))
    assert len(libs) == 1
    leftovers = [f.name for f in libs[0].parent.iterdir() if ".tmp" in f.name]
    assert leftovers == []
