"""The on-disk build cache: a second process compiling the same graph never starts the compiler."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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


RACE_SCRIPT = textwrap.dedent("""
    import ctypes, sys, time
    from kiln.runtime import cache
    start = float(sys.argv[1])
    while time.time() < start:  # every process reaches the build at the same instant
        pass
    lib = cache.build('extern "C" int kiln_race_answer(void) {{ return {value}; }}')
    print(ctypes.CDLL(str(lib)).kiln_race_answer())
""")


def test_processes_building_one_key_at_once_all_load_it(tmp_path):
    """Same-instant builds of one source: each compiles its own copy of the source, the renames publish one
    library, and every process loads a complete one (none compiles a file another is rewriting)."""
    env = dict(os.environ, KILN_CACHE_DIR=str(tmp_path / "cache"), KILN_CXX="g++")
    script = RACE_SCRIPT.format(value=4242)
    start = time.time() + 3
    procs = [subprocess.Popen([sys.executable, "-c", script, str(start)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
        assert out.strip() == "4242"
    folder = next((tmp_path / "cache" / "cpp").iterdir())
    names = sorted(f.name.split(".", 1)[1] for f in folder.iterdir())
    assert names == ["cpp", "so", "so.manifest.json"], f"temporary files were left behind: {names}"
