"""The on-disk build cache for generated C++.

A shared library is keyed by the SHA-256 of its source, the compiler command
and the flags; it lives in `$KILN_CACHE_DIR` (default `~/.cache/kiln`) under
`cpp/<key[:2]>/<key>.so`. A second process that generates the same source finds
the library and never starts the compiler. Writes go to a temporary file renamed
into place, so concurrent processes never load a half-written library.

A big source is built in parallel: the code generator puts `UNIT_MARK` lines
between functions that do not call each other, the text before the first mark
(the prelude) heads every piece, the pieces become translation units compiled
to objects at once (one compiler process per CPU, `KILN_BUILD_JOBS` to change
it) and are linked into the one library. g++ spends its time optimizing each
function, so the build scales with the CPUs.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kiln.config import cache_dir, compiler

log = logging.getLogger("kiln.runtime.cache")

# -fwrapv: eager's integer arithmetic wraps on overflow; without it signed overflow is undefined in C++ and
# the optimizer folds e.g. `-a > -b` into `b > a`, which differs from eager when a negation wraps.
# -ffp-contract=off: eager rounds each op; gcc would fuse `a*3 - b*3` into one fma, rounding once, so a value
# eager computes as exactly 0 comes out as a rounding error.
CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-fwrapv",
             "-ffp-contract=off"]
LIBS = ["-lmvec", "-lm"]  # glibc's vector math (the kernels' exp/erf/tanh... in simd loops)

# Between two independently compilable parts of a source (see the module docstring).
UNIT_MARK = "// kiln: unit\n"
# Below this many bytes of code per compiler process, a parallel build costs more than it saves.
MIN_UNIT_BYTES = 40_000

# What this process did: tests read it, and the debug report could.
stats = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "units": 0}

_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


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
    # Each process compiles its own copy of the source: another process building the same key at the same
    # time would otherwise rewrite the file under this one's compiler. The source is published beside the
    # library (for reading, never compiled from there) with the same atomic rename.
    src = write_private(lib.parent, ".cpp", source)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    stats["compiles"] += 1
    units = split_units(source, build_jobs())
    try:
        if len(units) == 1:
            _run([compiler(), *CXX_FLAGS, str(src), "-o", tmp, *LIBS])
        else:
            _build_units(units, lib, tmp)
    except BaseException:
        os.unlink(tmp)
        os.unlink(src)
        raise
    os.replace(tmp, lib)
    os.replace(src, lib.with_suffix(".cpp"))
    return lib


def write_private(folder: Path, suffix: str, text: str) -> Path:
    """`text` in a new file of this process's own in `folder` (a unique name, created exclusively)."""
    fd, path = tempfile.mkstemp(suffix=suffix, dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return Path(path)


def build_jobs() -> int:
    env = os.environ.get("KILN_BUILD_JOBS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def split_units(source: str, jobs: int) -> list[str]:
    """`source` as translation units for `jobs` compiler processes: each is the prelude and a run of parts,
    about equal in size (twice as many units as jobs, so a slow unit does not hold the others up)."""
    prelude, *parts = source.split(UNIT_MARK)
    size = sum(map(len, parts))
    count = min(len(parts), 2 * jobs, size // max(MIN_UNIT_BYTES, 1)) if jobs > 1 else 1
    if count <= 1:
        return [source]
    units, current, filled = [], [], 0
    for part in parts:
        current.append(part)
        filled += len(part)
        if filled >= size * (len(units) + 1) / count and len(units) < count - 1:
            units.append(prelude + "".join(current))
            current = []
    units.append(prelude + "".join(current))
    return [u for u in units if u != prelude]


def _build_units(units: list[str], lib: Path, out: str) -> None:
    """Compile each unit to an object file in parallel, then link them into `out`."""
    with tempfile.TemporaryDirectory(dir=lib.parent) as work:
        paths = []
        for k, unit in enumerate(units):
            path = Path(work) / f"unit{k}.cpp"
            path.write_text(unit)
            paths.append(path)
        compile_flags = [f for f in CXX_FLAGS if f != "-shared"]
        with ThreadPoolExecutor(max_workers=min(len(units), build_jobs())) as pool:
            list(pool.map(lambda p: _run([compiler(), *compile_flags, "-c", str(p), "-o", str(p.with_suffix(".o"))]),
                          paths))
        stats["units"] += len(units)
        _run([compiler(), *CXX_FLAGS, *[str(p.with_suffix(".o")) for p in paths], "-o", out, *LIBS])


class BuildError(RuntimeError):
    """The C++ compiler rejected a source."""


def _run(cmd: list[str]) -> None:
    log.debug("compiling %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"kiln: C++ compilation failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")


def compiles(source: str) -> bool:
    """Whether the compiler accepts `source` (parsed and checked only, no code generated): how a failed
    build finds the kernel that broke it."""
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "check.cpp"
        path.write_text(source)
        try:
            _run([compiler(), *[f for f in CXX_FLAGS if f != "-shared"], "-fsyntax-only", str(path)])
        except BuildError:
            return False
    return True


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
