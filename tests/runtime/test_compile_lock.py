"""The compile lock pauses the collector's full collections while a compilation holds it (kiln/runtime/compile_lock.py).

A full collection walks the whole heap; a compile grows the heap by hundreds of thousands of objects and would
start several. The young generations still run, and the thresholds the program had come back when the outermost
compilation ends, however it ends.
"""
from __future__ import annotations

import gc
import threading

import pytest
import torch

import kiln
from kiln.runtime.compile_lock import compile_lock


@pytest.fixture
def thresholds():
    """The collector's thresholds, set to known values for the test and restored after it."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*before)


def test_full_collections_wait_while_the_lock_is_held(thresholds):
    with compile_lock:
        young, middle, oldest = gc.get_threshold()
        assert (young, middle) == thresholds[:2]
        assert oldest > 10 ** 6
    assert gc.get_threshold() == thresholds


def test_nested_holds_restore_only_at_the_outermost(thresholds):
    with compile_lock:
        paused = gc.get_threshold()
        with compile_lock:
            assert gc.get_threshold() == paused
        assert gc.get_threshold() == paused  # the outer compilation is still running
    assert gc.get_threshold() == thresholds


def test_thresholds_come_back_when_a_compilation_raises(thresholds):
    with pytest.raises(ValueError), compile_lock:
        raise ValueError("a failed compile")
    assert gc.get_threshold() == thresholds
    assert compile_lock._lock.acquire(blocking=False)  # and the lock was released
    compile_lock._lock.release()


def test_another_thread_waits_for_the_lock(thresholds):
    entered, order = threading.Event(), []

    def other():
        entered.set()
        with compile_lock:
            order.append("other")

    with compile_lock:
        thread = threading.Thread(target=other)
        thread.start()
        entered.wait()
        thread.join(0.05)
        order.append("first")
    thread.join()
    assert order == ["first", "other"]
    assert gc.get_threshold() == thresholds


def test_capture_and_backend_run_paused_and_the_program_after_does_not(thresholds):
    seen = []

    def backend(gm, example_inputs):
        seen.append(gc.get_threshold())
        return gm.forward

    def f(x):
        return torch.relu(x) * 2

    x = torch.randn(8)
    compiled = kiln.compile(f, backend=backend)
    torch.testing.assert_close(compiled(x), f(x))
    assert len(seen) == 1 and seen[0][2] > 10 ** 6
    assert gc.get_threshold() == thresholds
    torch.testing.assert_close(compiled(x), f(x))  # a call that compiles nothing leaves the collector alone
    assert gc.get_threshold() == thresholds
