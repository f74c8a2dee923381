"""Folders and files kiln writes where another user or another process could interfere.

kiln's cache holds code it loads into the process (C++ libraries, Triton modules) and its debug
directory holds files a user reads; both live at predictable paths. Anything there that kiln did
not write itself is a way to run someone else's code as this user, or to make kiln overwrite a
file it never meant to (a planted symlink). So:

- every folder kiln uses is created `0700`, and one that exists already is used only if it is a
  real folder (not a symlink), owned by this user, and writable by no one else; otherwise kiln
  warns, naming the folder and why, and uses a private folder of its own instead (`PrivateTree`);
- every file is written to a fresh temporary name opened with `O_CREAT | O_EXCL | O_NOFOLLOW` and
  renamed into place, so a reader sees the old file or the new one, never half of one, and a
  planted symlink is replaced, never followed (`write_atomic`);
- each artifact kiln loads has a manifest beside it, written when it was built: its size and
  SHA-256, checked before it is loaded (`publish`, `verify`), so a truncated, empty or altered
  file is rebuilt instead of crashing the process or giving wrong numbers.

Temporary names carry the process id (`.<stem>.<pid>.<random>.tmp<suffix>`): the files of a process that
died mid-build are removed by the next build in that folder (`sweep_orphans`), and this process's
are removed at exit by kiln/runtime/compiler.py.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
import warnings
from pathlib import Path

log = logging.getLogger("kiln.runtime.cache")

MANIFEST_SUFFIX = ".manifest.json"
_TEMP_NAME = re.compile(r"^\..*\.(\d+)\.[0-9a-f]{8}\.tmp(\.[A-Za-z0-9]+)?$")


class KilnCacheWarning(UserWarning):
    """A cache or debug folder was refused (not this user's, or writable by others); kiln used a private one."""


class UnsafeFolder(OSError):
    """A folder kiln would write into or load from is not safe: `reason` says why."""

    def __init__(self, path: Path, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


def unsafe_reason(st: os.stat_result, is_dir: bool) -> str | None:
    """Why a folder (`is_dir`) or file with status `st` (from lstat) is not one kiln may trust, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if is_dir and not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if not is_dir and not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by {'others' if st.st_mode & stat.S_IWOTH else 'its group'} (mode {st.st_mode & 0o777:o})"
    return None


def ensure_private_dir(path: Path) -> Path:
    """`path` as a folder only this user can write: created 0700 (with its missing parents) or checked."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return ensure_private_dir(path)
    reason = unsafe_reason(os.lstat(path), is_dir=True)
    if reason is not None:
        raise UnsafeFolder(path, reason)
    return path


class PrivateTree:
    """A folder tree kiln owns (the cache, the debug directory), rooted where the user configured it, or, if
    that root or a folder under it is refused, in a private folder of this process's (a fresh `mkdtemp`, 0700):
    kiln still works, it only loses what other processes cached. Refusals warn once per path."""

    def __init__(self, what: str):
        self.what = what  # "cache", "debug directory": named in the warning
        self._fallback: Path | None = None
        self._warned: set[str] = set()
        self._lock = threading.Lock()

    def folder(self, root: Path, *parts: str) -> Path:
        """`root/parts...`, every folder of it checked (created 0700 where missing); the same under the private
        fallback root when one is refused."""
        try:
            return self._walk(root, parts)
        except UnsafeFolder as e:
            return self._walk(self._refuse(e), parts)

    def _walk(self, root: Path, parts: tuple[str, ...]) -> Path:
        path = ensure_private_dir(root)
        for part in parts:
            path = ensure_private_dir(path / part)
        return path

    def _refuse(self, e: UnsafeFolder) -> Path:
        with self._lock:
            if self._fallback is None:
                self._fallback = Path(tempfile.mkdtemp(prefix=f"kiln-{os.geteuid()}-"))
            if str(e.path) not in self._warned:
                self._warned.add(str(e.path))
                message = (f"kiln: refusing the {self.what} folder {e.path}: it {e.reason}; using the private "
                           f"folder {self._fallback} instead")
                log.warning("%s", message)
                warnings.warn(message, KilnCacheWarning, stacklevel=4)
            return self._fallback


def temp_name(path: Path) -> Path:
    """A fresh temporary name beside `path`, naming this process (see the module docstring), with `path`'s
    suffix last (the compiler reads the language from it)."""
    return path.with_name(f".{path.stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp{path.suffix}")


def create_exclusive(path: Path) -> int:
    """A descriptor of the new file `path`, opened for writing; never an existing file or a symlink's target."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write `data` to `path`: into a new temporary file beside it, then renamed over it (a symlink at `path`
    is replaced, not followed)."""
    tmp = temp_name(path)
    fd = create_exclusive(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    return path


def file_digest(path: Path) -> tuple[int, str]:
    """(size, SHA-256 hex) of the file at `path`, read without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        h, size = hashlib.sha256(), 0
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def manifest_path(artifact: Path) -> Path:
    return artifact.with_name(artifact.name + MANIFEST_SUFFIX)


def publish(built: Path, artifact: Path) -> Path:
    """Move the file `built` (a temporary name of this process's) to `artifact`, its manifest first: a reader
    that finds the artifact finds the manifest it was published with (a later writer of the same key writes
    the same bytes, or a manifest a reader rejects and rebuilds after)."""
    size, digest = file_digest(built)
    write_atomic(manifest_path(artifact), json.dumps({"size": size, "sha256": digest}))
    os.replace(built, artifact)
    return artifact


def verify(artifact: Path) -> str | None:
    """None if `artifact` is this user's regular file and matches its manifest; else why not ("missing" when
    there is no artifact at all)."""
    try:
        st = os.lstat(artifact)
    except FileNotFoundError:
        return "missing"
    reason = unsafe_reason(st, is_dir=False)
    if reason is not None:
        return f"the file {reason}"
    try:
        manifest = json.loads(manifest_path(artifact).read_bytes())
        expected = int(manifest["size"]), str(manifest["sha256"])
    except FileNotFoundError:
        return "no manifest"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest ({type(e).__name__})"
    size, digest = file_digest(artifact)
    if size != expected[0]:
        return f"{size} bytes where {expected[0]} were built (truncated or replaced)"
    if digest != expected[1]:
        return "content differs from the hash recorded when it was built"
    return None


def discard(artifact: Path) -> None:
    """Remove `artifact` and its manifest (a broken entry, to be rebuilt)."""
    _unlink(artifact)
    _unlink(manifest_path(artifact))


def sweep_orphans(folder: Path) -> None:
    """Remove temporary files in `folder` left by processes that no longer run (killed mid-build)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        m = _TEMP_NAME.match(name)
        if m and not _alive(int(m.group(1))):
            path = folder / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                _unlink(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
