"""Graphs whose ATen trace needs a size or value that depends on tensor data.

kiln's capture breaks before such ops, but a graph can still reach the autograd stage with one: the
backward of a masked write (`y[mask] = v`), or torch.compile's capture with
capture_dynamic_output_shape_ops / capture_scalar_outputs on, with kiln's backends behind it. That
variant runs the graph op by op with eager's autograd (a graph fallback, kiln/fallbacks.py), never an
exception.
"""
import pytest
import torch
import torch._dynamo

import kiln
from kiln.backends import resolve_backend


def masked_sum_and_count(x):
    return x[x > 0].sum() * 2 + torch.nonzero(x).shape[0]


def scaled_by_item(x):
    return x * x.sum().item()


def unique_plus(x):
    return torch.unique(x.detach().round()).sum() + x * 2


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "grad"])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
# torch.compile captures the data-dependent ops; kiln's backends run such a graph op by op (a graph fallback)
@pytest.mark.sampled(every=2, classes=("fn", "requires_grad"))
@pytest.mark.allows_fallback("graph: data-dependent sizes in the captured graph")
@pytest.mark.parametrize("fn", [masked_sum_and_count, scaled_by_item, unique_plus], ids=lambda f: f.__name__)
def test_behind_torch_compile_with_data_dependent_capture(fn, backend, requires_grad, fallback_log):
    torch._dynamo.reset()
    x = torch.tensor([0.5, -1.2, 2.3, -0.1, 1.7, -2.4], requires_grad=requires_grad)
    x_ref = x.detach().clone().requires_grad_(requires_grad)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        compiled = torch.compile(fn, backend=resolve_backend(backend, None, None), fullgraph=True)
        with pytest.warns(kiln.KilnFallbackWarning, match="depends on tensor data"):
            actual = compiled(x)
    expected = fn(x_ref)
    torch.testing.assert_close(actual, expected)
    assert actual.requires_grad == expected.requires_grad
    assert {f.kind for f in fallback_log.records()} == {"graph"}
    if requires_grad:
        actual.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
    torch._dynamo.reset()
