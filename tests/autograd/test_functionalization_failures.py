"""A graph torch's functionalization fails on runs op by op, a counted fallback, instead of failing the call.

`torch.func.functionalize` trips an internal assert of its own (`!value_.key_set().has(Functionalize)`) on a
write into an expanded view of an empty tensor that was filled in place (fuzz seed 481169, both compiling
backends): the call raised BackendCompilerFailed where eager returns. Eager and kiln side by side.
"""
import pytest
import torch

import kiln
from kiln import fallbacks


def fill_then_write_an_empty_expanded_view(a):
    a.fill_(1)
    t = torch.where(a > a, a, a)
    wide = t.unsqueeze(-1).expand(*t.shape, 3)
    wide[..., wide.shape[-1]:] = 0
    return [t, t[...]]


@pytest.mark.allows_fallback("torch's functionalization fails on the graph")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_the_graph_runs_op_by_op_with_eagers_result(backend):
    a = torch.zeros(0, dtype=torch.int32)
    want = fill_then_write_an_empty_expanded_view(a.clone())
    got = kiln.compile(fill_then_write_an_empty_expanded_view, backend=backend)(a.clone())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert any("functionalization failed" in f.describe() for f in fallbacks.records())
