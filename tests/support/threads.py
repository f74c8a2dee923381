"""Tests on tiny tensors run torch on one thread: OpenMP threads only contend on a shared 2-core CI machine."""
import contextlib

import torch


@contextlib.contextmanager
def one_torch_thread():
    """torch on one thread inside the block, its thread count as it was after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
