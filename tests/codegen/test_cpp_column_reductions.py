"""Column reductions on the C++ target: tiles of columns, rows outer (kiln/codegen/cpp/kernel.py, `_column_tiles`).

A bias gradient sums a [rows, columns] tensor over its rows. Row by row, each column's inner loop reads one
element per cache line and does not vectorize; in tiles of COLUMN_LANES columns the rows run outside and the
tile's columns inside, contiguous. Each case checks the results against eager and which loop order the kernel
took.
"""
from __future__ import annotations

import pytest
import torch

from kiln.codegen.cpp.kernel import COLUMN_LANES
from support.lowering import check

aten = torch.ops.aten


def tiled(compiled) -> bool:
    return "_tile" in compiled.artefacts["kernels.cpp"]


@pytest.mark.parametrize("reduce", ["sum", "amax", "amin", "prod", "any"])
@pytest.mark.parametrize("columns", [COLUMN_LANES * 4, 37])  # whole tiles, and a last tile of 5 columns
def test_column_reduction_equals_eager(reduce, columns):
    x = torch.randn(300, columns)
    if reduce == "any":
        x = x > 1.5
    elif reduce == "prod":
        x = 1 + x / 100
    compiled = check(lambda x: getattr(x, reduce)(0), x)
    assert tiled(compiled), compiled.artefacts["kernels.cpp"]


def test_gelu_backward_with_its_bias_gradient_is_one_tiled_kernel():
    x, g = torch.randn(512, 96), torch.randn(512, 96)

    def fn(x, g):
        grad = aten.gelu_backward(g, x)
        return grad, grad.sum(0)
    compiled = check(fn, x, g)
    assert compiled.num_kernels == 1 and tiled(compiled)


def test_columns_summed_over_two_row_dims_tile():
    # a LayerNorm's weight and bias gradients: [batch, tokens, features] summed over batch and tokens
    grad, normed = torch.randn(6, 50, 24), torch.randn(6, 50, 24)
    compiled = check(lambda g, n: ((g * n).sum((0, 1)), g.sum((0, 1))), grad, normed)
    assert tiled(compiled)


def test_a_batch_sum_of_a_3d_tensor_tiles_its_last_dim():
    # a position embedding's gradient: [batch, tokens, features] summed over the batch alone
    compiled = check(lambda g: g.sum(0), torch.randn(12, 7, 40))
    assert tiled(compiled)


def test_bfloat16_columns_accumulate_in_float():
    x = torch.randn(1000, 40, dtype=torch.bfloat16)
    assert tiled(check(lambda x: x.float().sum(0), x))


def test_symbolic_sizes_tile_too():
    x = torch.randn(50, 20)
    compiled = check(lambda x: x.sum(0), x, mode="symbolic")
    assert tiled(compiled)
    for shape in [(7, 3), (130, 33)]:
        y = torch.randn(*shape)
        torch.testing.assert_close(compiled(y)[0], y.sum(0))


def test_row_reductions_and_gathered_columns_keep_the_row_loop():
    # contiguous rows vectorize as they are; a concatenation's column index divides the outer variable,
    # which tiles would compute per element and row instead of once per column
    assert not tiled(check(lambda x: x.sum(1), torch.randn(64, 300)))
    a, b = torch.randn(200, 16), torch.randn(200, 16)
    assert not tiled(check(lambda a, b: torch.cat([a, b], 1).sum(0), a, b))
