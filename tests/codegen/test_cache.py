"""The on-disk build cache: a second process compiling the same graph never starts the compiler."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    from lower.helpers import check
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
