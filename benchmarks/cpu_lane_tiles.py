"""C++ target: a row's max or min in tiles of 16 lanes (kiln/codegen/cpp/kernel.py `_lane_tiles`) against the
one-element-at-a-time loop it replaced, and eager, on the CPU.

kiln's max keeps eager's NaN through a helper the vectorizer does not take as a reduction, so a row loop holding a
max or min had no SIMD clause and added one element at a time; in lane tiles each of 16 lanes keeps its own
accumulator and the tile's loop vectorizes. Each case is compiled both ways (the old loop by emptying
`LANE_TILED`), checked against eager, and the three are timed interleaved (median of 30 blocks of 5 calls).

    cd benchmarks && PYTHONPATH=.. python cpu_lane_tiles.py
"""
from __future__ import annotations

import contextlib

import torch

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
from common import print_cpp_rule_table
from kiln.codegen.cpp import kernel as cpp_kernel

CASES = {
    "row amax 4096x1024": (lambda x: x.amax(-1), (4096, 1024)),
    "row amin 4096x1024": (lambda x: x.amin(-1), (4096, 1024)),
    "row amax + sum 4096x1024": (lambda x: x.amax(-1) + x.sum(-1), (4096, 1024)),
    "softmax 4096x1024": (lambda x: torch.softmax(x, -1), (4096, 1024)),
}


@contextlib.contextmanager
def one_at_a_time():
    """No lane tiles: a max or min's loop as before them."""
    original = cpp_kernel.LANE_TILED
    cpp_kernel.LANE_TILED = frozenset()
    try:
        yield
    finally:
        cpp_kernel.LANE_TILED = original


if __name__ == "__main__":
    print_cpp_rule_table(CASES, one_at_a_time, ("one at a time", "lane tiles"))
