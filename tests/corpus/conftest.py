import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def one_thread():
    """Tiny tensors: OpenMP threads only contend on a shared machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
