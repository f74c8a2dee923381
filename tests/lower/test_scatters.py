"""Accumulating scatters and scans as dense reductions (kiln/lower/ops/scatters.py, scans.py), beside eager.

Each case must be generated (no extern), match eager in every reduction and `include_self`, raise what
eager raises for an index out of range, and, over the size a dense reduction may cost, stay ATen's.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.lower.ops.scatters import DENSE_LIMIT
from support.lowering import check, count_externs

G = torch.Generator().manual_seed(0)
X = torch.randn(4, 5, generator=G)
SRC = torch.randn(3, 5, generator=G)
INDEX = torch.randint(0, 4, (3, 5), generator=G)
ROWS = torch.tensor([0, 2, 2, 3, 0, 1])
SOURCE = torch.randn(6, 5, generator=G)

def _scatter_reduce(reduce, include_self):
    return lambda x, src, source: x.scatter_reduce(0, INDEX, src, reduce, include_self=include_self)


def _index_reduce(reduce, include_self):
    return lambda x, src, source: x.index_reduce(0, ROWS, source, reduce, include_self=include_self)


SCATTERS = {  # (x, src: like SRC, source: like SOURCE) -> a tensor
    "scatter_add": lambda x, src, source: x.scatter_add(0, INDEX, src),
    "scatter_add_smaller_index": lambda x, src, source: x.scatter_add(1, INDEX[:2, :3].clamp(max=4), src[:2, :3]),
    "scatter_add_0dim": lambda x, src, source: x[0, 0].scatter_add(0, torch.tensor(0), src[0, 0]) * 2,
    **{f"scatter_reduce_{r}_{'self' if s else 'noself'}":
       _scatter_reduce(r, s)
       for r in ("sum", "prod", "mean", "amax", "amin") for s in (True, False)},
    "index_add": lambda x, src, source: x.index_add(0, ROWS, source, alpha=2),
    "index_add_dim1": lambda x, src, source: x.index_add(1, torch.tensor([4, 0, 4]), source[:4, :3]),
    **{f"index_reduce_{r}_{'self' if s else 'noself'}":
       _index_reduce(r, s)
       for r in ("prod", "mean", "amax", "amin") for s in (True, False)},
    "index_fill": lambda x, src, source: x.index_fill(0, torch.tensor([0, -1, 0]), 2),
    "index_fill_tensor_value": lambda x, src, source: x.index_fill(1, torch.tensor(2), torch.tensor(-1)),
    "index_put_accumulate": lambda x, src, source: x.index_put((ROWS[:4], torch.tensor([1, 1, 4, 0])),
                                                               src[0, 0], accumulate=True),
    "cumsum": lambda x, src, source: x.cumsum(1), "cumsum_rows": lambda x, src, source: x.cumsum(0),
    "cumprod": lambda x, src, source: x.cumprod(-1),
}


@pytest.mark.filterwarnings("ignore:index_reduce")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
def test_scatters_and_scans_are_generated_and_match_eager(dtype):
    x, src, source = ((t * 3).to(dtype) for t in (X, SRC, SOURCE))
    compiled = check(lambda x, src, source: tuple(f(x, src, source) for f in SCATTERS.values()), x, src, source)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


@pytest.mark.parametrize("name", ["gather", "take_along_dim", "index", "index_two_dims", "index_select",
                                  "upsample_nearest_1d", "upsample_nearest_exact_2d"])
def test_backward_of_indexing_accumulates_in_a_kernel(name):
    """Autograd writes the gradient of a gather or an indexing into zeros with scatter_add / index_put
    (accumulate) / index_add, and nearest upsampling's backward is decomposed into one: each runs as
    kiln's kernel and gives eager's gradient."""
    fn = {
        "gather": lambda x: x.gather(1, INDEX[:, :3].clamp(max=4)) * 2,
        "take_along_dim": lambda x: torch.take_along_dim(x, INDEX.clamp(max=3), 0).sin(),
        "index": lambda x: x[ROWS] * 3,
        "index_two_dims": lambda x: x[ROWS[:4], torch.tensor([[1], [4]])].exp(),
        "index_select": lambda x: x.index_select(0, ROWS).cos(),
        "upsample_nearest_1d": lambda x: torch.nn.functional.interpolate(x[None], size=7, mode="nearest").sin(),
        "upsample_nearest_exact_2d": lambda x: torch.nn.functional.interpolate(
            x[None, None], size=(7, 3), mode="nearest-exact").sin(),
    }[name]
    x = X.clone().requires_grad_()
    out = fn(x)
    cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    expected = torch.autograd.grad(out, x, cotangent)[0]
    kiln.reset()
    got = torch.autograd.grad(kiln.compile(fn, dynamic=False)(x), x, cotangent)[0]
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("fn, error", [
    (lambda x: x.scatter_add(0, torch.tensor([[9]]), torch.ones(1, 1)), RuntimeError),
    (lambda x: x.index_add(0, torch.tensor([-1]), torch.ones(1, 5)), RuntimeError),
    (lambda x: x.index_reduce(0, torch.tensor([4]), torch.ones(1, 5), "prod"), IndexError),
    (lambda x: x.index_fill(0, torch.tensor([7]), 1.0), IndexError),
    (lambda x: x.index_put((torch.tensor([7]),), torch.ones(5), accumulate=True), IndexError),
], ids=["scatter_add", "index_add_negative", "index_reduce", "index_fill", "index_put"])
def test_an_index_out_of_range_raises_as_eager_does(fn, error):
    with pytest.raises(error):
        fn(X)
    kiln.reset()
    with pytest.raises(error):
        kiln.compile(fn, dynamic=False)(X)


def test_a_scatter_over_the_dense_limit_stays_an_aten_call():
    rows = DENSE_LIMIT // 64 + 1  # output elements x index length just over the limit
    x, index = torch.zeros(rows, 8), torch.zeros(64, 8, dtype=torch.int64)
    compiled = check(lambda x, index: (x.scatter_add(0, index, torch.ones(64, 8)), x.cumsum(0)), x, index)
    assert count_externs(compiled) == 2, compiled.artefacts["schedule"]


DYNAMIC_ROWS = {  # x: (rows, 5) with `rows` a symbol -> a tensor; the dense cost is a product of symbols
    "scatter_add": lambda x: x.scatter_add(1, INDEX[:1, :3].clamp(max=4).expand(x.shape[0], 3), x[:, :3]),
    "scatter_of_a_value": lambda x: x.scatter(1, INDEX[:1, :2].clamp(max=4).expand(x.shape[0], 2), 3.0),
    "index_fill": lambda x: x.index_fill(1, torch.tensor([0, 3]), 2.0),
    "index_add": lambda x: x.index_add(1, torch.tensor([4, 0, 4]), x[:, :3]),
    "cumsum": lambda x: x.cumsum(1),
    "gather_backward": lambda x: x.gather(1, INDEX[:1, :3].clamp(max=4).expand(x.shape[0], 3)) * 2,
    "index_select_backward": lambda x: x.index_select(1, torch.tensor([1, 1, 4])).sin(),
}


@pytest.mark.parametrize("name", sorted(DYNAMIC_ROWS))
def test_a_dense_reduction_over_symbolic_sizes_compiles(name):
    """With dynamic sizes the dense cost is a product of symbols, which Python cannot compare with the limit
    (sympy raised 'cannot determine truth value of Relational' and the whole graph fell back): where the
    guards bound it the reduction is generated, otherwise the op stays ATen's; values and gradients are eager's."""
    fn = DYNAMIC_ROWS[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for rows in (3, 6):
        x = torch.randn(rows, 5, generator=G, dtype=torch.float64, requires_grad=True)
        expected = fn(x)
        cotangent = torch.randn(expected.shape, generator=G, dtype=torch.float64)
        got = compiled(x)
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(torch.autograd.grad(got, x, cotangent)[0],
                                   torch.autograd.grad(expected, x, cotangent)[0])


@pytest.mark.parametrize("name", ["one_index", "two_broadcast_indices"])
def test_backward_of_indexing_with_a_symbolic_index_length_compiles(name):
    """The gradient of `x[i]` is an accumulating index_put whose index tensors have symbolic lengths under
    dynamic shapes: their broadcast shape is symbolic too (converting it to ints raised TypeError and the whole
    backward graph ran through ATen). Two index lengths: one graph, eager's gradients, no fallback."""
    fn = {"one_index": lambda x, i: (x[i] * 2).sum(0),
          "two_broadcast_indices": lambda x, i: x[i[:, None], i.flip(0)[None, :].clamp(max=4)].exp().sum()}[name]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for n in (5, 7):
        x = torch.randn(10, 5, generator=G, dtype=torch.float64, requires_grad=True)
        i = torch.randint(0, 10, (n,), generator=G)
        expected, got = fn(x, i), compiled(x, i)
        torch.testing.assert_close(got, expected)
        cotangent = torch.randn(expected.shape, generator=G, dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad(got, x, cotangent)[0],
                                   torch.autograd.grad(expected, x, cotangent)[0])


SYMBOLIC_LENGTHS = {  # (x: (rows, 5), index: (n, 5) in [0, rows), src: (n, 5)) -> a tensor; n a symbol
    "scatter_add": lambda x, index, src: x.scatter_add(0, index, src),
    "scatter_reduce_amax": lambda x, index, src: x.scatter_reduce(0, index, src, "amax", include_self=False),
    "index_add": lambda x, index, src: x.index_add(0, index[:, 0], src),
    "index_put_accumulate": lambda x, index, src: x.index_put((index[:, 0],), src, accumulate=True),
    "cumsum": lambda x, index, src: src.cumsum(0),
}


@pytest.mark.parametrize("name", sorted(SYMBOLIC_LENGTHS))
def test_a_dense_reduction_of_symbolic_length_is_a_kernel(name):
    """The index length along the scattered dim is a symbol, so the dense cost (output x length) is open to the
    guards: it is decided at the compiled sizes (a size guard), and the op is generated, not left to ATen."""
    fn = SYMBOLIC_LENGTHS[name]
    x, index, src = torch.randn(4, 5, generator=G), INDEX[:3], SRC
    compiled = check(fn, x, index, src, mode="symbolic")
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


def test_a_symbolic_scatter_past_the_dense_limit_compiles_again_as_an_aten_call(compiled_graphs):
    """The dense choice made at small sizes is a guard: the same function called with an output whose dense cost
    is past DENSE_LIMIT fails it and compiles again, with the scatter as ATen's op; both match eager."""
    fn = SYMBOLIC_LENGTHS["scatter_add"]
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for rows, n in ((4, 3), (6, 5), (DENSE_LIMIT // 64, 64)):
        x = torch.randn(rows, 5, generator=G)
        index = torch.randint(0, rows, (n, 5), generator=G)
        src = torch.randn(n, 5, generator=G)
        torch.testing.assert_close(compiled(x, index, src), fn(x, index, src))
    dense, past_the_limit = compiled_graphs
    assert count_externs(dense) == 0, dense.artefacts["schedule"]
    assert count_externs(past_the_limit) == 1, past_the_limit.artefacts["schedule"]
