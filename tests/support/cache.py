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


def seed_guard_extension(root: Path) -> None:
    """Copy the guards' extension built for the tests (kiln/capture/tensor_checks.py) into the cache `root`, as a
    machine that ran kiln before has it: processes over `root` load it rather than each fresh cache starting its
    own detached build (twenty seconds of the compiler competing with the tests). Nothing where it cannot be
    built. Under `fresh_cache` it is the session's (the `guard_extension` fixture, conftest.py)."""
    import shutil

    from kiln.capture import tensor_checks
    from kiln.runtime.private_files import manifest_path

    module = tensor_checks.wait()
    if module is None:
        return
    built = Path(module.__file__)
    folder = root / built.parent.relative_to(built.parents[2])  # ext/<key>
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path in (built, manifest_path(built)):
        shutil.copy2(path, folder / path.name)
