"""In-place view ops (`t_`, `transpose_`, `unsqueeze_`, `squeeze_`) on tensors the graph made, with symbolic sizes.

The ATen trace records a size as read from the tensor it was first seen on; after `t0.t_()` that tensor has
other dims, and the functionalization re-trace read the size from the wrong one (fuzz seed 12408:
`t0 = b[:, ::2]; t0.t_(); t0.unsqueeze(-1).expand(*t0.shape, 3)` raised "expand: attempting to expand a
dimension of length ((s49 + 1)//2) -> 2"). Each case runs eagerly and compiled over changing sizes.
"""
from __future__ import annotations

import pytest
import torch

import kiln


def transposed_slice_expanded(b):
    t0 = b[:, ::2]
    t0.t_()
    return t0.unsqueeze(-1).expand(*t0.shape, 3) * 1


def transposed_in_place_then_sized(b):
    t0 = b * 2
    t0.transpose_(0, 1)
    return t0.reshape(t0.shape[0], -1).sum(1), t0.new_zeros(t0.shape)


def unsqueezed_then_squeezed(b):
    t0 = b[1:]
    t0.unsqueeze_(0)
    t1 = t0.expand(2, *t0.shape[1:]) + 1
    t0.squeeze_(0)
    return t1, t0.flip(0)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", [transposed_slice_expanded, transposed_in_place_then_sized, unsqueezed_then_squeezed],
                         ids=lambda f: f.__name__)
def test_in_place_views_over_changing_sizes(fn, backend):
    compiled = kiln.compile(fn, backend=backend)
    for cols in (2, 7, 5):
        b = torch.arange(3 * cols, dtype=torch.float32).reshape(3, cols)
        expected, got = fn(b.clone()), compiled(b.clone())
        for e, g in zip(expected if isinstance(expected, tuple) else (expected,),
                        got if isinstance(got, tuple) else (got,)):
            assert g.shape == e.shape and g.stride() == e.stride()
            torch.testing.assert_close(g, e)


def test_an_in_place_view_of_an_input_reaches_the_caller():
    """A graph input keeps its op: the caller's tensor has the new geometry after the call, as in eager."""
    def fn(a):
        a.t_()
        return a * 2

    compiled = kiln.compile(fn, backend="aot_eager")
    for cols in (2, 7, 5):
        a, b = torch.ones(3, cols), torch.ones(3, cols)
        torch.testing.assert_close(compiled(b), fn(a))
        assert b.shape == a.shape and b.stride() == a.stride()
