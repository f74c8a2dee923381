"""Running the C++ compiler: with a time limit, and never outliving the process.

Every compiler process kiln starts (kernels, units of a parallel build, the guards' tensor
checks) runs through `run`, which

- kills it, with every process it started (it leads its own process group), once it has run
  `config.compiler_timeout` seconds, and raises `CompilerTimeout` naming the command: a hung
  compiler becomes an error the pipeline turns into an ATen fallback, not a first call that
  never returns;
- keeps it in a table with the temporary files its build writes (`temporary`), so that at exit
  (`atexit`, which runs while a daemon build thread is still alive) the compiler is killed and the
  files are removed: no orphaned compiler, no half-written files left in the cache.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kiln.config import config

log = logging.getLogger("kiln.runtime.cache")


class BuildError(RuntimeError):
    """The C++ compiler rejected a source, or what it built could not be loaded."""


class CompilerTimeout(BuildError):
    """The compiler ran past `kiln.config.compiler_timeout` and was killed."""


_lock = threading.Lock()
_running: set[subprocess.Popen] = set()
_temporaries: set[Path] = set()
_exiting = False


def run(cmd: list[str], timeout: float | None = None) -> None:
    """Run the compiler command `cmd`; raise BuildError with its error output if it fails, CompilerTimeout if
    it runs past `timeout` seconds (default `config.compiler_timeout`)."""
    timeout = config.compiler_timeout if timeout is None else timeout
    log.debug("compiling %s", " ".join(cmd))
    with _lock:
        if _exiting:
            raise BuildError("kiln: the process is exiting; no new compiler is started")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        _running.add(proc)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise CompilerTimeout(f"kiln: the C++ compiler ran for more than {timeout:g} s and was killed "
                              f"(kiln.config.compiler_timeout, KILN_COMPILER_TIMEOUT): {' '.join(cmd)}") from None
    except BaseException:
        _kill(proc)
        raise
    finally:
        with _lock:
            _running.discard(proc)
    if proc.returncode != 0:
        raise BuildError(f"kiln: C++ compilation failed ({' '.join(cmd)}):\n{(err or '')[-4000:]}"
                         if proc.returncode > 0 else f"kiln: the C++ compiler was killed by signal "
                         f"{-proc.returncode} ({' '.join(cmd)})")


@contextmanager
def temporary(*paths: Path) -> Iterator[None]:
    """Files or folders a build writes, removed when it leaves the block (published ones were renamed away
    already) or at exit, whichever comes first."""
    with _lock:
        _temporaries.update(paths)
    try:
        yield
    finally:
        for path in paths:
            _remove(path)
        with _lock:
            _temporaries.difference_update(paths)


def _kill(proc: subprocess.Popen) -> None:
    """Kill the compiler and everything it started (cc1plus, as, ld), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=10)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        pass


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


@atexit.register
def _clean_up_at_exit() -> None:
    """Kill the compilers still running (a daemon build thread's) and remove the builds' temporary files."""
    global _exiting
    with _lock:
        _exiting = True
        running, leftovers = list(_running), list(_temporaries)
    for proc in running:  # the thread that started it reaps it (or the process exits first)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for path in leftovers:
        _remove(path)


__all__ = ["BuildError", "CompilerTimeout", "run", "temporary"]
