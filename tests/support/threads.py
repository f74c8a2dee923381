"""Thread counts of torch (and of kiln's OpenMP kernels, which share torch's OpenMP runtime) in tests.

CI runs two test workers on two cores with OMP_NUM_THREADS=1 (scripts/test.sh): more threads only contend there,
and a parallel region waiting on a thread the other worker holds costs more than it saves. A test of a parallel
path (a kernel's loops split over threads, per-thread partial reductions) says so with `torch_threads(2)`.
"""
import contextlib

import torch


@contextlib.contextmanager
def torch_threads(count: int):
    """torch (and kiln's kernels) on `count` threads inside the block, the thread count as it was after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def one_torch_thread():
    """torch on one thread inside the block: tiny tensors gain nothing from more."""
    return torch_threads(1)
