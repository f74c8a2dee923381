"""Symbolic ints passed to a direct aten call whose schema takes `int` or `int[]` (kiln/capture/values/torch_api.py
`_concrete_int_arguments`).

Under `dynamic=True` an int the frame reads from its arguments (a dict of an op's keywords) is a symbol; ATen's
parser accepts none where the schema says `int[2] kernel_size` (not `SymInt[]`), so capture's fake call raised
and the graph broke. The graph passes the value, guarded, as eager does; a new value recompiles.
Strict, several values, eager's results.
"""
from __future__ import annotations

import pytest
import torch

import kiln

aten = torch.ops.aten
G = torch.Generator().manual_seed(0)


def pool_backward_scalar_sizes(x, k, s):  # an int where the schema has int[2]: ATen broadcasts it
    out, indices = aten.max_pool2d_with_indices.default(x, [k, k], [s, s])
    return aten.max_pool2d_with_indices_backward.default(torch.ones_like(out), x, k, s, 0, 1, False, indices)


def pool_backward_list_sizes(x, k, s):  # symbols inside an int[2] list
    out, indices = aten.max_pool2d_with_indices.default(x, [k, k], [s, s])
    return aten.max_pool2d_with_indices_backward.default(out * 2, x, [k, k], [s, s], [0, 0], [1, 1], False, indices)


def pool_backward_keyword(x, k, s):
    out, indices = aten.max_pool2d_with_indices.default(x, [k, k], [s, s])
    return aten.max_pool2d_with_indices_backward.default(out, x, kernel_size=[k, k], stride=s, padding=0,
                                                         dilation=1, ceil_mode=False, indices=indices)


@pytest.mark.parametrize("fn", [pool_backward_scalar_sizes, pool_backward_list_sizes, pool_backward_keyword])
def test_symbolic_ints_reach_a_plain_int_argument_as_their_values(fn):
    kiln.reset()
    def call(x, sizes):  # the sizes in a dict, as OpInfo samples pass an op's keywords
        return fn(x, sizes["k"], sizes["s"])

    compiled = kiln.compile(call, dynamic=True)
    for k, s, n in ((3, 2, 6), (3, 2, 9), (2, 1, 7)):
        x = torch.randn(1, 2, n, n + 1, generator=G)
        torch.testing.assert_close(compiled(x, {"k": k, "s": s}), call(x, {"k": k, "s": s}))
