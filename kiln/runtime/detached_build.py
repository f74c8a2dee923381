"""A build that outlives the process that asked for it (the guards' C++ extension, kiln/capture/tensor_checks.py).

That extension takes the C++ compiler about twenty seconds. A short process (a script, a test, a server that is
restarted) exits sooner, and a build running in one of its threads was killed with it: every process started the
build again and none finished it. Here the build runs in a process of its own, in its own session (a terminal's
Ctrl-C to the parent's process group does not reach it), which publishes the library into the cache whether or
not the process that started it still runs; the next process finds it there.

- Builders of one artifact take turns on a lock file beside it (`flock`): the second one finds the first's
  artifact, checked against its manifest, and builds nothing. Either way each publishes under a temporary name
  renamed into place with its manifest (kiln/runtime/private_files.py), so a reader never sees half a library.
- The builder applies the compiler's time limit itself (`kiln.config.compiler_timeout`, handed over): a hung
  compiler is killed with everything it started. It removes its temporary files on every way out, a SIGTERM
  included; the files of a builder killed outright carry its pid, and the next build in the folder removes them
  (`sweep_orphans`).
- It imports neither torch nor kiln: this file runs as a script and loads private_files.py from beside it (the
  standard library only), so it starts in milliseconds and takes no memory from the model.

    start(command, source, artifact, timeout).wait()   in the process that needs it: start the builder (at
                                                       once), then wait for it (in a thread, or not at all)
"""
from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

LOCK_SUFFIX = ".lock"


class DetachedBuildFailed(RuntimeError):
    """The builder did not publish the artifact: the compiler failed or timed out (its message says which)."""


class Build:
    """A detached builder started by `start`: `wait()` for its artifact."""

    def __init__(self, command: list[str], source: str, artifact: Path, timeout: float):
        self.artifact = artifact
        request = json.dumps({"command": command, "source": source, "artifact": str(artifact), "timeout": timeout})
        self.errors = tempfile.TemporaryFile()  # anonymous: gone once both processes have closed it
        self.proc = subprocess.Popen([sys.executable, __file__, request], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.errors, start_new_session=True,
                                     close_fds=True)

    def wait(self) -> Path:
        """The published artifact, once the builder is done; DetachedBuildFailed with its error output if not."""
        try:
            if self.proc.wait() != 0:
                self.errors.seek(0)
                raise DetachedBuildFailed(self.errors.read().decode(errors="replace")[-4000:] or
                                          f"kiln: the builder of {self.artifact} exited with {self.proc.returncode}")
        finally:
            self.errors.close()
        return self.artifact


def start(command: list[str], source: str, artifact: Path, timeout: float) -> Build:
    """Start building `artifact` in a detached process, now (before this call returns, so that a process exiting
    right after still leaves the build running): `source` written to a temporary file, `command` run with
    "{source}" and "{output}" standing for the temporary paths, the output published as `artifact` with its
    manifest."""
    return Build(command, source, artifact, timeout)


# ----------------------------------------------------------------------------- the builder (this file as a script)


def _private_files():
    """kiln/runtime/private_files.py, loaded from beside this file without importing kiln (or torch)."""
    spec = importlib.util.spec_from_file_location("kiln_private_files", Path(__file__).with_name("private_files.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _terminated(signum, frame):
    raise SystemExit(f"kiln: the builder was stopped by signal {signum}")  # runs the cleanup below


def _main(request: dict) -> int:
    files = _private_files()
    artifact = Path(request["artifact"])
    lock = os.open(artifact.with_name(artifact.name + LOCK_SUFFIX),
                   os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when this process ends, however it ends
    if files.verify(artifact) is None:  # another builder published it while this one waited
        return 0
    files.sweep_orphans(artifact.parent)
    source, output = files.temp_name(artifact.with_suffix(".cpp")), files.temp_name(artifact)
    try:
        with os.fdopen(files.create_exclusive(source), "w") as f:
            f.write(request["source"])
        command = [a.replace("{source}", str(source)).replace("{output}", str(output)) for a in request["command"]]
        _compile(command, float(request["timeout"]))
        files.publish(output, artifact)
    finally:
        for path in (source, output):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
    return 0


def _compile(command: list[str], timeout: float) -> None:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except BaseException as e:  # the time limit, or a SIGTERM to the builder: the compiler goes with it
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if isinstance(e, subprocess.TimeoutExpired):
            raise SystemExit(f"kiln: the C++ compiler ran for more than {timeout:g} s and was killed "
                             f"(kiln.config.compiler_timeout, KILN_COMPILER_TIMEOUT): {' '.join(command)}") from None
        raise
    if proc.returncode != 0:
        raise SystemExit(f"kiln: C++ compilation failed ({' '.join(command)}):\n{(err or '')[-4000:]}")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(_main(json.loads(sys.argv[1])))
