"""C++ target: a row's max or min in tiles of 16 lanes (kiln/codegen/cpp/kernel.py `_lane_tiles`) against the
one-element-at-a-time loop it replaced, and eager, on the CPU.

kiln's max keeps eager's NaN through a helper the vectorizer does not take as a reduction, so a row loop holding a
max or min had no SIMD clause and added one element at a time; in lane tiles each of 16 lanes keeps its own
accumulator and the tile's loop vectorizes. Each case is compiled both ways (the old loop by emptying
`LANE_TILED`), checked against eager, and the three are timed interleaved (median of 30 blocks of 5 calls).

    python benchmarks/cpu_lane_tiles.py
"""
from __future__ import annotations

import torch

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
from common import cpu_median_us
from kiln import config
from kiln.codegen.cpp import kernel as cpp_kernel
from kiln.lower.decompositions import decomposition_table
from kiln.pipeline import compile_aten_graph

CASES = {
    "row amax 4096x1024": lambda x: x.amax(-1),
    "row amin 4096x1024": lambda x: x.amin(-1),
    "row amax + sum 4096x1024": lambda x: x.amax(-1) + x.sum(-1),
    "softmax 4096x1024": lambda x: torch.softmax(x, -1),
}


def compiled(fn, inputs, tiles: bool):
    from torch.fx.experimental.proxy_tensor import make_fx

    original = cpp_kernel.LANE_TILED
    if not tiles:
        cpp_kernel.LANE_TILED = frozenset()
    try:
        with torch.no_grad():
            gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
        return compile_aten_graph(gm, list(inputs), None)
    finally:
        cpp_kernel.LANE_TILED = original


def main() -> None:
    config.graph_cache = False  # the two versions of a graph share its cache key
    print(f"| case | one at a time | lane tiles | eager |  (us per call, {torch.get_num_threads()} threads)\n"
          "|---|---|---|---|")
    for name, fn in CASES.items():
        inputs = [torch.randn(4096, 1024)]
        versions = {"flat": compiled(fn, inputs, False), "tiles": compiled(fn, inputs, True), "eager": fn}
        for version in versions.values():
            got = version(*inputs)
            got = got[0] if isinstance(got, (list, tuple)) else got
            torch.testing.assert_close(got, fn(*inputs), rtol=1e-4, atol=1e-4)
        times = {k: cpu_median_us(v, inputs) for k, v in versions.items()}
        print(f"| {name} | {times['flat']:.0f} | {times['tiles']:.0f} | {times['eager']:.0f} |")


if __name__ == "__main__":
    main()
