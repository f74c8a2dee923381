"""C++ target: column reductions in tiles of columns (kiln/codegen/cpp/kernel.py `_column_tiles`) against the
row-by-row loop they replace, and eager, on the CPU.

Each case is compiled twice (tiles on, and `_is_column_reduction` forced False), checked against eager, then
the three are timed interleaved (median of 30 blocks of 5 calls).

    python benchmarks/cpu_column_reductions.py
"""
from __future__ import annotations

import torch

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
from common import cpu_median_us
from kiln import config
from kiln.codegen.cpp import kernel as cpp_kernel
from kiln.lower.decompositions import decomposition_table
from kiln.pipeline import compile_aten_graph

aten = torch.ops.aten


def _with_grad(grad_fn):
    def fn(*args):
        grad = grad_fn(*args)
        return grad, grad.sum(0)
    return fn


CASES = {
    "gelu backward + bias gradient 2048x256": (_with_grad(lambda x, g: aten.gelu_backward(g, x)), (2048, 256), 2),
    "relu backward + bias gradient 64x128": (_with_grad(lambda x, g: torch.where(x > 0, g, 0)), (64, 128), 2),
    "column sum 2048x64": (lambda x: x.sum(0), (2048, 64), 1),
    "column max 4096x100": (lambda x: x.amax(0), (4096, 100), 1),
    "row sum 2048x256 (not tiled)": (lambda x: x.sum(1), (2048, 256), 1),
}


def compiled(fn, inputs, tiles: bool):
    from torch.fx.experimental.proxy_tensor import make_fx

    original = cpp_kernel.CppKernel._is_column_reduction
    if not tiles:
        cpp_kernel.CppKernel._is_column_reduction = lambda self: False
    try:
        with torch.no_grad():
            gm = make_fx(fn, decomposition_table=decomposition_table())(*inputs)
        return compile_aten_graph(gm, list(inputs), None)
    finally:
        cpp_kernel.CppKernel._is_column_reduction = original


def _listed(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]




def main() -> None:
    config.graph_cache = False  # the two versions of a graph share its cache key: the second would load the first
    print(f"{'case':40s} {'rows':>10s} {'tiles':>10s} {'eager':>10s}   "
          f"(us per call, {torch.get_num_threads()} threads)")
    for name, (fn, shape, n) in CASES.items():
        inputs = [torch.randn(*shape) for _ in range(n)]
        versions = {"rows": compiled(fn, inputs, False), "tiles": compiled(fn, inputs, True), "eager": fn}
        for version in versions.values():
            torch.testing.assert_close(_listed(version(*inputs)), _listed(fn(*inputs)), rtol=1e-4, atol=1e-4)
        times = {k: cpu_median_us(v, inputs) for k, v in versions.items()}
        print(f"{name:40s} {times['rows']:10.1f} {times['tiles']:10.1f} {times['eager']:10.1f}")


if __name__ == "__main__":
    main()
