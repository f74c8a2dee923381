"""`diagonal` is a view: an index rewrite of its input, fused into its consumer (diag, trace, diagonal_copy
ran it as an ATen extern)."""
from __future__ import annotations

import pytest
import torch

from support.lowering import check, count_externs


@pytest.mark.parametrize("offset, dim1, dim2", [(0, 0, 1), (1, 0, 1), (-2, 0, 1), (2, 1, 2), (-1, -1, 0), (0, 2, 0),
                                                (7, 0, 1)])
def test_diagonal_of_a_3d_tensor(offset, dim1, dim2):
    def fn(a):
        return torch.diagonal(a, offset, dim1, dim2) * 2

    assert count_externs(check(fn, torch.randn(4, 5, 6))) == 0


@pytest.mark.parametrize("fn", [torch.trace, torch.diag, lambda a: a.t().diagonal(1) + 1,
                                lambda a: torch.diagonal_copy(a[1:, ::2], -1)], ids=["trace", "diag", "t", "copy"])
def test_diagonal_of_views_and_reductions(fn):
    assert count_externs(check(fn, torch.randn(5, 6))) == 0


def test_integer_diagonal():
    assert count_externs(check(lambda a: a.diagonal().neg(), torch.arange(20).reshape(4, 5))) == 0
