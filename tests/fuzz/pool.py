"""Programs run in worker subprocesses, so a SIGFPE or SIGSEGV is a counted outcome and not the end of a run.

A worker (`python tests/fuzz --worker BACKEND DEVICE`) reads one JSON request a line from stdin,
`{"seed": 12}` or `{"source": "..."}`, runs the program, and answers one line `@@RESULT {json}` on
stdout. The parent side (`Worker`) restarts a worker that died or went past its timeout and reports
that program as "died", with the signal and the end of the worker's stderr.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

MARKER = "@@RESULT "
ROOT = Path(__file__).resolve().parents[2]
RECYCLE_AFTER = 100  # programs per worker process: bounds what caches and leaks can grow to


def serve(backend: str, device: str) -> None:
    """The worker's loop (in the subprocess)."""
    import torch

    from tests.fuzz.compare import run_program
    from tests.fuzz.programs import generate
    from tests.fuzz.targets import program_device

    torch.set_num_threads(1)
    for line in sys.stdin:
        request = json.loads(line)
        source = request.get("source", "")
        try:
            source = source or generate(request["seed"], program_device(device))
            outcome = run_program(source, backend, device).to_dict()
        except Exception as e:  # noqa: BLE001 - the harness itself failed: report, don't stop the run
            outcome = {"status": "crash", "kind": f"harness:{type(e).__name__}", "message": str(e)[:300]}
        outcome["program"] = source
        print(MARKER + json.dumps(outcome), flush=True)


class Worker:
    """One worker subprocess for one backend, restarted when it dies, hangs or has run RECYCLE_AFTER programs."""

    def __init__(self, backend: str, device: str, timeout: float):
        self.backend, self.device, self.timeout = backend, device, timeout
        self.proc = None

    def _start(self) -> None:
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "OMP_NUM_THREADS": "1"}
        self.stderr = tempfile.TemporaryFile(mode="w+")
        command = [sys.executable, str(ROOT / "tests" / "fuzz"), "--worker", self.backend, self.device]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, env=env, cwd=ROOT)
        self.lines: queue.Queue = queue.Queue()
        self.served = 0
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()

    @staticmethod
    def _read(proc, lines: queue.Queue) -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def run(self, request: dict) -> dict:
        if self.proc is None or self.served >= RECYCLE_AFTER:
            self.close()
            self._start()
        self.served += 1
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        while True:
            try:
                line = self.lines.get(timeout=self.timeout)
            except queue.Empty:
                return self._died("timeout", f"no result after {self.timeout:.0f} s")
            if line is None:
                code = self.proc.wait()
                name = signal.Signals(-code).name if code < 0 else f"exit {code}"
                return self._died(name, f"worker process ended ({name})")
            if line.startswith(MARKER):
                return json.loads(line[len(MARKER):])

    def _died(self, kind: str, message: str) -> dict:
        self.proc.kill()
        self.proc.wait()
        self.stderr.seek(0)
        tail = [line for line in self.stderr.read().strip().split("\n") if line.strip()][-3:]
        self.proc = None
        return {"status": "died", "kind": kind, "message": message + (": " + " | ".join(tail) if tail else "")}

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.kill()
            self.proc.wait()
            self.proc = None
