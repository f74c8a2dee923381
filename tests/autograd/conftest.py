import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    """Tiny models: OpenMP threads only contend on the shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
