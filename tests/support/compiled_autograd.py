"""Fixtures shared by the compiled-autograd and optimizer tests: tiny models on one thread, and the autograd
engine's compiled-autograd state reset around each test (it is process-wide)."""
from __future__ import annotations

import pytest

import kiln
from support.threads import one_torch_thread


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    """Tiny models (support/threads.py)."""
    with one_torch_thread():
        yield


@pytest.fixture(autouse=True)
def fresh_compiled_autograd():
    """Each test starts with the engine's cache empty and compiled autograd off."""
    kiln.compiled_autograd.reset()
    yield
    kiln.config.compiled_autograd = False
    kiln.compiled_autograd.reset()
