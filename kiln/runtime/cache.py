"""The on-disk build cache for generated C++.

A shared library is keyed by the SHA-256 of its source, the compiler command
and the flags; it lives in `$KILN_CACHE_DIR` (default `~/.cache/kiln`) under
`cpp/<key[:2]>/<key>.so`. A second process that generates the same source finds
the library and never starts the compiler.

What is on disk is not trusted blindly (kiln/runtime/private_files.py): the folders
must be this user's and writable by no one else, and a library is loaded only if it
matches the manifest (size, SHA-256) written when it was built. A library that is
missing its manifest, truncated, altered, or that the loader rejects is removed and
built again, once, with one log line. Each process compiles its own copy of the
source to its own temporary names and publishes with atomic renames, so processes
building the same key at once never read each other's half-written files: each ends
with a correct library, and one that finishes after another published the key uses that
one's library and drops its own.

A big source is built in parallel: the code generator puts `UNIT_MARK` lines
between functions that do not call each other, the text before the first mark
(the prelude) heads every piece, the pieces become translation units compiled
to objects at once (one compiler process per CPU, `KILN_BUILD_JOBS` to change
it) and are linked into the one library. g++ spends its time optimizing each
function, so the build scales with the CPUs.

Most of a small library's build is the compiler parsing the standard headers every kernel source starts
with (<cmath>, <algorithm>, ...). Those `#include` lines are precompiled once per cache, compiler and flags
(`pch/<key[:2]>/<key>.h` and its `.gch`), and each build reads them through `-include`: the compiler loads
the precompiled form, or parses the header's text where it cannot use it. The source still includes them
itself (a second include of a guarded header costs nothing), so the library is the same either way.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kiln.config import cache_dir, compiler
from kiln.runtime import compiler as compiler_process
from kiln.runtime.compiler import BuildError, CompilerTimeout
from kiln.runtime.private_files import PrivateTree, create_exclusive, discard, publish, sweep_orphans, temp_name, verify

log = logging.getLogger("kiln.runtime.cache")

# -fwrapv: eager's integer arithmetic wraps on overflow; without it signed overflow is undefined in C++ and
# the optimizer folds e.g. `-a > -b` into `b > a`, which differs from eager when a negation wraps.
# -ffp-contract=off: eager rounds each op; gcc would fuse `a*3 - b*3` into one fma, rounding once, so a value
# eager computes as exactly 0 comes out as a rounding error.
# -fsignaling-nans: gcc would fold `x * -1` and `x / -1` into `-x`, which flips a NaN's sign where eager's product
# keeps it (tests/codegen/test_nan_bits.py), and `x * 1` into `x`, which leaves a signaling NaN unquieted.
CXX_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-fwrapv",
             "-ffp-contract=off", "-fsignaling-nans"]
LIBS = ["-lmvec", "-lm"]  # glibc's vector math (the kernels' exp/erf/tanh... in simd loops)

# Between two independently compilable parts of a source (see the module docstring).
UNIT_MARK = "// kiln: unit\n"
# Below this many bytes of code per compiler process, a parallel build costs more than it saves.
MIN_UNIT_BYTES = 40_000

# What this process did: tests read it, and the debug report could.
stats = {"compiles": 0, "disk_hits": 0, "memory_hits": 0, "units": 0, "rebuilds": 0, "headers": 0}

_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()
_tree = PrivateTree("cache")


_used: dict[str, Path] = {}  # what this process built or read, by its path in the cache (kiln.save_cache_artifacts)


def record_use(path: Path) -> None:
    """Remember `path` (a file in the cache) as one this process compiled with."""
    try:
        _used[path.relative_to(folder()).as_posix()] = path
    except ValueError:  # outside the cache root in use (a refused root's fallback changed it): not portable
        pass


def used() -> dict[str, Path]:
    """The cache files this process compiled with, by their path in the cache."""
    return dict(_used)


def folder(*parts: str) -> Path:
    """The cache folder `parts` (e.g. "cpp", "ab"), created 0700 and checked, or its private stand-in
    (kiln/runtime/private_files.py)."""
    return _tree.folder(cache_dir(), *parts)


def source_key(source: str) -> str:
    h = hashlib.sha256()
    h.update(source.encode())
    h.update(("\0".join([compiler()] + CXX_FLAGS + LIBS)).encode())
    return h.hexdigest()


def build(source: str) -> Path:
    """Path of the shared library for `source`, checked against its manifest, compiling it only if no process
    has before (or what is there is broken)."""
    key = source_key(source)
    lib = folder("cpp", key[:2]) / f"{key}.so"
    problem = verify(lib)
    if problem is None:
        stats["disk_hits"] += 1
    else:
        if problem != "missing":
            rebuild_log(lib, problem)
            discard(lib)
        _compile(source, lib)
    record_use(lib)
    return lib


def rebuild_log(artifact: Path, problem: str) -> None:
    stats["rebuilds"] += 1
    log.warning("kiln: rebuilding the cached %s: %s", artifact, problem)


def _compile(source: str, lib: Path) -> Path:
    """Compile `source` under this process's own temporary names and publish it as `lib` (with its manifest),
    and the source beside it (for reading: never compiled from there)."""
    sweep_orphans(lib.parent)
    src, out = temp_name(lib.with_suffix(".cpp")), temp_name(lib)
    stats["compiles"] += 1
    with compiler_process.temporary(src, out):
        write_new(src, source)
        units = split_units(source, build_jobs())
        headers = precompiled_headers(source)
        if len(units) == 1:
            compiler_process.run([compiler(), *CXX_FLAGS, *headers, str(src), "-o", str(out), *LIBS])
        else:
            _build_units(units, lib, out, headers)
        if verify(lib) is not None:  # else another process published this key meanwhile: its library serves
            publish(out, lib)
            os.replace(src, lib.with_suffix(".cpp"))
    return lib


_not_precompiled: set[str] = set()  # keys of headers this process's compiler refused to precompile


def leading_includes(source: str) -> str:
    """The `#include` lines `source` starts with (comments and blank lines between them skipped)."""
    lines = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#include"):
            lines.append(stripped + "\n")
        elif stripped and not stripped.startswith("//"):
            break
    return "".join(lines)


def precompiled_headers(source: str) -> list[str]:
    """The flags that give the compiler the headers `source` starts with precompiled (see the module docstring),
    building them on first use; [] where the source starts with none or the compiler could not precompile them
    (a compiler that hangs raises CompilerTimeout, as the build it would have been part of)."""
    headers = leading_includes(source)
    flags = [f for f in CXX_FLAGS if f != "-shared"]
    key = hashlib.sha256("\0".join([compiler(), *flags, headers]).encode()).hexdigest()
    if not headers or key in _not_precompiled:
        return []
    header = folder("pch", key[:2]) / f"{key}.h"
    precompiled = header.with_name(header.name + ".gch")
    if not _headers_match(header, precompiled):
        try:
            _precompile(headers, header, precompiled, flags)
        except CompilerTimeout:
            raise
        except (BuildError, OSError) as e:
            log.info("kiln: building without precompiled headers: %s", e)
            _not_precompiled.add(key)
            return []
    return ["-include", str(header)]


# The precompiled headers this process found matching their manifests, with the files' identity then (`_identity`).
# The precompiled form is tens of megabytes, which a check reads whole: every build of a new library made one.
_matched_headers: dict[Path, tuple] = {}


def _identity(*paths: Path) -> tuple | None:
    """What changes when a file is replaced (a publish renames a new file into place: another inode) or written
    (its size, modification or change time): None where one of `paths` is missing."""
    try:
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for st in map(os.lstat, paths))
    except OSError:
        return None


def _headers_match(header: Path, precompiled: Path) -> bool:
    """Whether `header` and its `precompiled` form match their manifests: checked whole the first time, and again
    only once either file was replaced or written since."""
    before = _identity(header, precompiled)
    if before is not None and _matched_headers.get(precompiled) == before:
        return True
    if verify(header) is not None or verify(precompiled) is not None:
        return False
    if before is not None and _identity(header, precompiled) == before:  # not replaced while it was read
        _matched_headers[precompiled] = before
    return True


def _precompile(headers: str, header: Path, precompiled: Path, flags: list[str]) -> None:
    """Write `headers` to `header` and compile them to `precompiled` beside it, under this process's own temporary
    names (published precompiled form first: a reader uses the pair only when both match their manifests)."""
    sweep_orphans(header.parent)
    src, out = temp_name(header), temp_name(precompiled)
    stats["headers"] += 1
    with compiler_process.temporary(src, out):
        write_new(src, headers)
        compiler_process.run([compiler(), *flags, "-x", "c++-header", str(src), "-o", str(out)])
        publish(out, precompiled)
        publish(src, header)


def write_new(path: Path, data: str | bytes) -> Path:
    """`data` in the new file `path` (created exclusively, never through a symlink)."""
    with os.fdopen(create_exclusive(path), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return path


def publish_new(path: Path, data: str | bytes, what: str) -> bool:
    """Publish `data` at `path` (a temporary file renamed into place, its manifest first) and record its use;
    False, with one log line, where the cache cannot take it (full or read-only: the process keeps `what` it
    made all the same)."""
    tmp = temp_name(path)
    try:
        write_new(tmp, data)
        publish(tmp, path)
    except OSError as e:
        log.info("kiln: could not store %s in %s (%s)", what, path, e)
        discard(tmp)
        return False
    record_use(path)
    return True


class Unusable(ValueError):
    """Raised by a `read_published` decoder for content it refuses, with the reason."""


def read_published(path: Path, decode: Callable[[bytes], object]):
    """What `decode` makes of the file published at `path` (`publish_new`) when it matches its manifest, its use
    recorded; None when there is none. A broken one (not matching its manifest, unreadable, or content `decode`
    refuses: `Unusable`) is removed with one log line, and its product made again."""
    problem = verify(path)
    if problem == "missing":
        return None
    if problem is None:
        try:
            value = decode(path.read_bytes())
            record_use(path)
            return value
        except (OSError, ValueError, EOFError, TypeError) as e:
            problem = str(e) if isinstance(e, Unusable) else f"unreadable ({type(e).__name__})"
    rebuild_log(path, problem)
    discard(path)
    return None


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


def _build_units(units: list[str], lib: Path, out: Path, headers: list[str]) -> None:
    """Compile each unit to an object file in parallel (`headers`: precompiled_headers' flags), then link them
    into `out`."""
    work = temp_name(lib.with_suffix(".units"))
    with compiler_process.temporary(work):
        os.mkdir(work, 0o700)
        paths = [write_new(work / f"unit{k}.cpp", unit) for k, unit in enumerate(units)]
        compile_flags = [f for f in CXX_FLAGS if f != "-shared"]
        with ThreadPoolExecutor(max_workers=min(len(units), build_jobs())) as pool:
            list(pool.map(lambda p: compiler_process.run(
                [compiler(), *compile_flags, *headers, "-c", str(p), "-o", str(p.with_suffix(".o"))]), paths))
        stats["units"] += len(units)
        compiler_process.run([compiler(), *CXX_FLAGS, *[str(p.with_suffix(".o")) for p in paths], "-o", str(out),
                              *LIBS])


def compiles(source: str) -> bool:
    """Whether the compiler accepts `source` (parsed and checked only, no code generated): how a failed
    build finds the kernel that broke it."""
    with tempfile.TemporaryDirectory() as work:
        path = write_new(Path(work) / "check.cpp", source)
        try:
            compiler_process.run([compiler(), *[f for f in CXX_FLAGS if f != "-shared"], "-fsyntax-only", str(path)])
        except CompilerTimeout:
            raise
        except BuildError:
            return False
    return True


def load(source: str) -> ctypes.CDLL:
    """The loaded library for `source` (built or fetched from disk once per process). A library the loader
    rejects (a bad ELF file, a compiler that "succeeded" with garbage) is built again once; if that fails too,
    BuildError (the kernels fall back to ATen) and nothing stays in the cache."""
    key = source_key(source)
    with _lock:
        if key in _loaded:
            stats["memory_hits"] += 1
            return _loaded[key]
        path = build(source)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            rebuild_log(path, f"the loader rejected it ({e})")
            discard(path)
            path = build(source)
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as again:
                discard(path)
                raise BuildError(f"kiln: the library built from the kernels cannot be loaded: {again}") from again
        _loaded[key] = lib
        return lib
