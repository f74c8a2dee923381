"""Helpers of the cache tests (tests/runtime/test_cache_*.py): small C++ sources, fake compilers."""
from __future__ import annotations

import ctypes
import secrets
from pathlib import Path

from kiln.runtime import cache

OTHER_UID = 4242  # another user than the one running the tests (they run as root here: os.chown works)


def answer_source(value: int) -> str:
    """A library whose `kiln_answer()` returns `value`, unique to this call (the loader of this process has
    never seen its path, so a rebuilt file is really loaded)."""
    return f'extern "C" long kiln_answer(void) {{ return {value}; }}  // {secrets.token_hex(8)}\n'


def answer(lib: ctypes.CDLL) -> int:
    lib.kiln_answer.restype = ctypes.c_long
    return lib.kiln_answer()


def library_path(root: Path, source: str) -> Path:
    key = cache.source_key(source)
    return root / "cpp" / key[:2] / f"{key}.so"


def fake_compiler(folder: Path, body: str) -> Path:
    """A shell script standing in for g++ (point KILN_CXX at it); `body` sees the arguments in "$@"."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "fake-g++"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return script
