"""C++ target: full reductions (every element to one value) with their innermost loop cut into vectorized blocks
(kiln/codegen/cpp/kernel.py `_open_blocked_loops`) against the flat loop they replace, and eager, on the CPU.

A full reduction splits its elements among threads, each adding into its own partial. Flat, each thread's loop
adds one element at a time (no SIMD: the partial is thread-private, and a worksharing loop cannot reduce into
it); in blocks, the threads share out blocks of REDUCTION_BLOCK elements and each block is one `omp simd`
loop (a max or min, which has no SIMD clause, in lane tiles within each block: `_tiled_loop`). Each case is
compiled both ways, checked against eager, and the three are timed interleaved (median of
30 blocks of 5 calls).

    python benchmarks/cpu_full_reductions.py
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


def compiled(fn, inputs, blocks: bool):
    from torch.fx.experimental.proxy_tensor import make_fx

    original, lane_tiled = cpp_kernel.CppKernel._open_blocked_loops, cpp_kernel.LANE_TILED
    if not blocks:
        cpp_kernel.CppKernel._open_blocked_loops, cpp_kernel.LANE_TILED = _flat, frozenset()
    try:
        with torch.no_grad():
            gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
        return compile_aten_graph(gm, list(inputs), None)
    finally:
        cpp_kernel.CppKernel._open_blocked_loops, cpp_kernel.LANE_TILED = original, lane_tiled




def main() -> None:
    config.graph_cache = False  # the two versions of a graph share its cache key
    print(f"| case | flat | blocks | eager |  (us per call, {torch.get_num_threads()} threads)\n|---|---|---|---|")
    for name, (fn, shape) in CASES.items():
        inputs = [torch.randn(*shape)]
        versions = {"flat": compiled(fn, inputs, False), "blocks": compiled(fn, inputs, True), "eager": fn}
        for version in versions.values():
            got = version(*inputs)
            got = got[0] if isinstance(got, (list, tuple)) else got
            torch.testing.assert_close(got, fn(*inputs), rtol=1e-4, atol=1e-4)
        times = {k: cpu_median_us(v, inputs) for k, v in versions.items()}
        print(f"| {name} | {times['flat']:.0f} | {times['blocks']:.0f} | {times['eager']:.0f} |")


if __name__ == "__main__":
    main()
