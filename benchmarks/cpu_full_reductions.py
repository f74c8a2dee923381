"""C++ target: full reductions (every element to one value) with their innermost loop cut into vectorized blocks
(kiln/codegen/cpp/kernel.py `_open_blocked_loops`) against the flat loop they replace, and eager, on the CPU.

A full reduction splits its elements among threads, each adding into its own partial. Flat, each thread's loop
adds one element at a time (no SIMD: the partial is thread-private, and a worksharing loop cannot reduce into
it); in blocks, the threads share out blocks of REDUCTION_BLOCK elements and each block is one `omp simd`
loop (a max or min, which has no SIMD clause, in lane tiles within each block: `_tiled_loop`). Each case is
compiled both ways, checked against eager, and the three are timed interleaved (median of
30 blocks of 5 calls).

    cd benchmarks && PYTHONPATH=.. python cpu_full_reductions.py
"""
from __future__ import annotations

import contextlib

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
from common import print_cpp_rule_table
from kiln.codegen.cpp import kernel as cpp_kernel

CASES = {
    "sum 2048x2048": (lambda x: x.sum(), (2048, 2048)),
    "sum 4M (one loop)": (lambda x: x.sum(), (4 * 2**20,)),
    "mean of squares 2048x2048": (lambda x: (x * x).mean(), (2048, 2048)),
    "amax 2048x2048": (lambda x: x.amax(), (2048, 2048)),
    "sum 64x64x56x56 (NCHW)": (lambda x: x.sum(), (64, 64, 56, 56)),
}


def _flat(self, sizes, variables, pragma_shared, pragma_block) -> int:
    """The loops before blocks: every inner loop collapsed and shared out, no SIMD."""
    collapse = f" collapse({len(sizes)})" if len(sizes) > 1 else ""
    return self._open_loops(sizes, variables, pragma_shared + collapse, None)


@contextlib.contextmanager
def flat():
    """No blocks (nor lane tiles in them): every thread adds its elements one at a time."""
    original, lane_tiled = cpp_kernel.CppKernel._open_blocked_loops, cpp_kernel.LANE_TILED
    cpp_kernel.CppKernel._open_blocked_loops, cpp_kernel.LANE_TILED = _flat, frozenset()
    try:
        yield
    finally:
        cpp_kernel.CppKernel._open_blocked_loops, cpp_kernel.LANE_TILED = original, lane_tiled


if __name__ == "__main__":
    print_cpp_rule_table(CASES, flat, ("flat", "blocks"))
