"""The on-disk build cache for generated C++.

A shared library is keyed by the SHA-256 of its source, the compiler command
and the flags; it lives in `$KILN_CACHE_DIR` (default `~/.cache/kiln`) under
`cpp/<key[:2]>/<key>.so`. A second process that generates the same source finds
the library and never starts the compiler. Writes go to a temporary file renamed
into place, so concurrent processes never load a half-written library.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("kiln.runtime.cache")

CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno"]
LIBS = ["-lmvec", "-lm"]  # glibc's vector math (the kernels' exp/erf/tanh... in simd loops)

# What this process did: tests read it, and the debug report could.
stats = {"compiles": 0, "disk_hits": 0, "memory_hits": 0}

_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


def cache_dir() -> Path:
    return Path(os.environ.get("KILN_CACHE_DIR") or Path.home() / ".cache" / "kiln")


def compiler() -> str:
    """The C++ compiler command (KILN_CXX, else CXX, else g++)."""
    return os.environ.get("KILN_CXX") or os.environ.get("CXX") or "g++"


def source_key(source: str) -> str:
    h = hashlib.sha256()
    h.update(source.encode())
    h.update(("\0".join([compiler()] + CXX_FLAGS + LIBS)).encode())
    return h.hexdigest()


def build(source: str) -> Path:
    """Path of the shared library for `source`, compiling it only if no process has before."""
    key = source_key(source)
    lib = cache_dir() / "cpp" / key[:2] / f"{key}.so"
    if lib.exists():
        stats["disk_hits"] += 1
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    src = lib.with_suffix(".cpp")
    src.write_text(source)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    cmd = [compiler(), *CXX_FLAGS, str(src), "-o", tmp, *LIBS]
    log.debug("compiling %s", " ".join(cmd))
    stats["compiles"] += 1
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"kiln: C++ compilation failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    os.replace(tmp, lib)
    return lib


def load(source: str) -> ctypes.CDLL:
    """The loaded library for `source` (built or fetched from disk once per process)."""
    key = source_key(source)
    with _lock:
        if key in _loaded:
            stats["memory_hits"] += 1
            return _loaded[key]
        lib = ctypes.CDLL(str(build(source)))
        _loaded[key] = lib
        return lib
