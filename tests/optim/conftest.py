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
