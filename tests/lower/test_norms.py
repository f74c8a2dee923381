"""Vector norms are reductions of pointwise ops (abs, powers), fused with what they read; `empty_permuted` (how
`empty_like` of a permuted tensor is traced) is an allocation kiln lowers like the other `empty`s. Both ran as
ATen externs."""
from __future__ import annotations

import functools

import pytest
import torch

import kiln
from support.lowering import check, count_externs


def vector_norm(a, ord, dim=None, keepdim=False, dtype=None):
    return torch.linalg.vector_norm(a, ord, dim, keepdim, dtype=dtype)


@pytest.mark.sampled(every=3, classes=("ord",))
@pytest.mark.parametrize("ord", [2, 1, float("inf"), float("-inf"), 0, 3.5, -1])
@pytest.mark.parametrize("dim", [None, 1, (0, 2)])
def test_vector_norm(ord, dim):
    assert count_externs(check(functools.partial(vector_norm, ord=ord, dim=dim), torch.randn(4, 5, 6))) == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_vector_norm_keeps_eager_dtype(dtype):
    check(functools.partial(vector_norm, ord=2, dim=1, keepdim=True), torch.randn(4, 5).to(dtype))
    check(functools.partial(vector_norm, ord=2, dtype=torch.float64), torch.randn(4, 5).to(dtype))


def test_loss_built_on_empty_like(compiled_graphs):
    def loss(a, b, y):
        return torch.nn.functional.hinge_embedding_loss(a, b.sign()) + torch.nn.functional.cosine_embedding_loss(
            a, b, y, reduction="none").sum()

    a, b, y = torch.randn(5, 6), torch.randn(5, 6), torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0])
    torch.testing.assert_close(kiln.compile(loss, fullgraph=True)(a, b, y), loss(a, b, y))
    assert [count_externs(g) for g in compiled_graphs] == [0]
