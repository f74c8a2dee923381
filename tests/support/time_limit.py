"""A wall-clock limit for one step of a long sweep (the OpInfo table, the transformers zoo, CPython's tests).

A hung kernel build or compile costs that step, not the sweep: SIGALRM raises `TimeLimitExceeded` in the main
thread. Its own exception class, so that the code under test (CPython's tests catch TimeoutError) cannot swallow it.
"""
from __future__ import annotations

import contextlib
import signal


class TimeLimitExceeded(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    def expire(signum, frame):
        raise TimeLimitExceeded(f"over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
