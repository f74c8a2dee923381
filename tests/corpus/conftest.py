import pytest

from support.threads import one_torch_thread


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    """Tiny tensors (support/threads.py)."""
    with one_torch_thread():
        yield
