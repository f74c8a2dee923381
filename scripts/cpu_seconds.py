"""CPU seconds of a command and of every process it starts, those that outlive their parent included.

The tests' child processes start detached builders (kiln/runtime/detached_build.py: the guards' extension), which
outlive the child and are reparented away from the test run, so `/usr/bin/time` and RUSAGE_CHILDREN miss them. This
script makes itself their subreaper (Linux): orphans are reparented to it, it waits for every one, and the total
covers them all. CPU time, unlike wall time, does not depend on what else a shared machine runs:

    OMP_NUM_THREADS=1 CI=true python scripts/cpu_seconds.py python -m pytest tests/runtime/test_cache_warm.py -n 0 -q
"""
from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(command: list[str]) -> int:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("cpu_seconds: cannot become a subreaper; processes outliving their parent are not counted",
              file=sys.stderr)
    start = time.time()
    code = subprocess.call(command)
    while True:  # the orphans reparented here, each reaped so that its time is counted
        try:
            os.wait()
        except ChildProcessError:
            break
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"cpu_seconds: {used.ru_utime + used.ru_stime:.1f} (user {used.ru_utime:.1f}, system {used.ru_stime:.1f}),"
          f" wall {time.time() - start:.0f} s, exit {code}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
