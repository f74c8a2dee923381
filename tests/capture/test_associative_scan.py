"""torch's `associative_scan` inside a compiled function: one graph, eager's values.

Eager runs it (combine_mode="generic" on the CPU) as a tree of vmapped `combine_fn` calls that capture
cannot step into; kiln inlines the same scan as a fold of `combine_fn` over the scanned dim
(values/polyfills.py). Mamba's selective scan calls it when `is_torchdynamo_compiling()`. Each case
compares with eager and with torch.compile's graph count (fullgraph=True) measured here.
"""
import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._higher_order_ops.associative_scan import associative_scan

import kiln
from support.capture import CountingBackend, assert_same


def selective_scan_step(left, right):  # Mamba's combine: h_t = a_t * h_{t-1} + b_t
    a_left, b_left = left
    a_right, b_right = right
    return a_left * a_right, a_right * b_left + b_right


def mamba_scan(a, b):
    return associative_scan(selective_scan_step, (a, b), dim=2, combine_mode="generic")


def cumulative_sum(x):
    return associative_scan(lambda left, right: left + right, x, dim=-1, combine_mode="generic")


def reversed_max(x):
    return associative_scan(torch.maximum, x, dim=0, reverse=True, combine_mode="generic")


def matrix_products(x):  # not pointwise: each element is a matrix, combined by matmul
    return associative_scan(lambda left, right: left @ right, x, dim=0, combine_mode="generic")


def dict_of_running_stats(x):
    def combine(left, right):
        return {"sum": left["sum"] + right["sum"], "max": torch.maximum(left["max"], right["max"])}

    return associative_scan(combine, {"sum": x, "max": x * 2}, dim=1, combine_mode="generic")


CASES = {
    "mamba_scan": (mamba_scan, (torch.rand(2, 3, 5, 4), torch.randn(2, 3, 5, 4))),
    "cumulative_sum": (cumulative_sum, (torch.randn(3, 7),)),
    "reversed_max": (reversed_max, (torch.randn(6, 2),)),
    "matrix_products": (matrix_products, (torch.randn(4, 3, 3) / 2,)),
    "dict_of_running_stats": (dict_of_running_stats, (torch.randn(2, 5),)),
    "one_element": (cumulative_sum, (torch.randn(3, 1),)),
}


@pytest.mark.parametrize("name", CASES)
def test_associative_scan_is_one_graph(name):
    fn, args = CASES[name]
    torch._dynamo.reset()
    counter = CompileCounter()
    torch.compile(fn, backend=counter, fullgraph=True)(*args)
    backend = CountingBackend()
    assert_same(fn(*args), kiln.compile(fn, backend=backend, fullgraph=True)(*args))
    assert backend.graphs == counter.frame_count == 1


def test_associative_scan_trains_under_the_default_backend():
    a, b = torch.rand(2, 3, 5, 4, requires_grad=True), torch.randn(2, 3, 5, 4, requires_grad=True)
    a2, b2 = (t.detach().clone().requires_grad_() for t in (a, b))
    mamba_scan(a, b)[1].sum().backward()
    kiln.compile(mamba_scan, fullgraph=True)(a2, b2)[1].sum().backward()
    assert_same((a.grad, b.grad), (a2.grad, b2.grad))


@pytest.mark.allows_fallback("frame: the scan's argument check raises, and the frame runs eagerly to raise it")
@pytest.mark.parametrize("bad", [
    lambda x: associative_scan(torch.add, x, dim=0, combine_mode="pointwise"),  # pointwise needs CUDA
    lambda x: associative_scan(torch.add, x, dim=0, combine_mode="serial"),
    lambda x: associative_scan(torch.add, x[:0], dim=0, combine_mode="generic"),
])
def test_associative_scan_raises_what_eager_raises(bad):
    x = torch.randn(3, 2)
    with pytest.raises(ValueError) as expected:
        bad(x)
    with pytest.raises(ValueError) as got:
        kiln.compile(bad, backend=CountingBackend())(x)
    assert str(got.value) == str(expected.value)
