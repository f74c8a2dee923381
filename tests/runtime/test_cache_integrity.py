"""A cached artifact is checked against the manifest written when it was built: a missing, truncated, empty,
garbage or altered one is removed and rebuilt (one log line), never loaded; a library the loader rejects is
built once more before kiln gives up on it, and a build that keeps failing falls back to ATen."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from kiln.runtime import cache
from kiln.runtime.private_files import manifest_path
from support.cache import answer, answer_source, fake_compiler, library_path, seed_guard_extension

CORRUPTIONS = {
    "truncated": lambda data: data[:4096],
    "empty": lambda data: b"",
    "garbage": lambda data: os.urandom(len(data)),
    "one_byte_changed": lambda data: data[:-100] + bytes([data[-100] ^ 1]) + data[-99:],
    "missing_manifest": None,
}


def _corrupt(lib, how: str) -> None:
    if how == "missing_manifest":
        manifest_path(lib).unlink()
    else:
        data = lib.read_bytes()
        lib.unlink()
        lib.write_bytes(CORRUPTIONS[how](data))
        lib.chmod(0o700)


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_corrupted_library_is_rebuilt_once_and_correct(fresh_cache, caplog, monkeypatch, how):
    source = answer_source(7)
    lib = cache.build(source)
    _corrupt(lib, how)
    monkeypatch.setattr(cache, "_loaded", {})
    compiles = cache.stats["compiles"]
    with caplog.at_level(logging.WARNING, logger="kiln.runtime.cache"):
        assert answer(cache.load(source)) == 7
    assert cache.stats["compiles"] == compiles + 1
    rebuilt = [r for r in caplog.records if "rebuilding" in r.getMessage()]
    assert len(rebuilt) == 1 and str(lib) in rebuilt[0].getMessage()


def test_a_compiler_that_succeeds_with_garbage_is_tried_twice_then_nothing_is_kept(fresh_cache, tmp_path,
                                                                                  monkeypatch):
    """The loader rejects what was built: one rebuild, then BuildError, and no entry that would never heal."""
    script = fake_compiler(tmp_path / "bin", 'while [ "$1" != "-o" ]; do shift; done\n'
                                             'head -c 20000 /dev/urandom > "$2"\nexit 0')
    monkeypatch.setenv("KILN_CXX", str(script))
    source = answer_source(1)
    compiles = cache.stats["compiles"]
    with pytest.raises(cache.BuildError, match="cannot be loaded"):
        cache.load(source)
    assert cache.stats["compiles"] == compiles + 2
    assert not library_path(fresh_cache, source).exists()
    monkeypatch.delenv("KILN_CXX")
    monkeypatch.setenv("CXX", "g++")
    assert answer(cache.load(source)) == 1  # a working compiler later: built and loaded


SCRIPT = """
import torch, kiln
from kiln.runtime import cache
def model(x, w):
    return torch.relu(x @ w).sum(-1) * 2 + x.sum(-1)
x, w = torch.randn(4, 8), torch.randn(8, 8)
torch.testing.assert_close(kiln.compile(model)(x, w), model(x, w))
print("rebuilds", cache.stats["rebuilds"])
"""


def test_next_process_rebuilds_a_truncated_library_and_is_correct(fresh_cache):
    """The issue's SIGBUS: a library truncated to a few KB crashed every later process. Strict mode: the
    rebuilt kernels run, no fallback."""
    seed_guard_extension(fresh_cache)
    env = dict(os.environ, KILN_CACHE_DIR=str(fresh_cache), KILN_STRICT="1", OMP_NUM_THREADS="1")
    first = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    for lib in (fresh_cache / "cpp").rglob("*.so"):
        _corrupt(lib, "truncated")
    second = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.stdout.split() == ["rebuilds", "1"]
