"""Fusion: the number of kernels kiln generates for known patterns (golden counts)."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.autograd import aot_compile
from kiln.lower.decompositions import decomposition_table
from kiln.pipeline import compile_aten_graph
from support.lowering import check, count_externs


def test_pointwise_chain_is_one_kernel():
    x = torch.randn(8, 33)
    c = check(lambda x: ((x.sin() * 2 + 1).relu() - x.exp()).sigmoid(), x)
    assert c.num_kernels == 1 and count_externs(c) == 0


def test_layernorm_is_at_most_two_kernels():
    x, w, b = torch.randn(6, 32), torch.randn(32), torch.randn(32)
    c = check(lambda x, w, b: F.layer_norm(x, (32,), w, b), x, w, b)
    assert c.num_kernels <= 2 and count_externs(c) == 0
    # mean and variance live in registers: the only buffer allocated is the output
    assert c.artefacts["wrapper.py"].count("empty_strided(") == 1


def test_softmax_is_at_most_two_kernels():
    x = torch.randn(5, 40)
    c = check(lambda x: x.softmax(-1), x)
    assert c.num_kernels <= 2 and count_externs(c) == 0
    c = check(lambda x: x.log_softmax(-1), x)
    assert c.num_kernels <= 2


def test_linear_gelu_add_is_extern_mm_plus_one_kernel():
    lin = torch.nn.Linear(16, 24)
    x, r = torch.randn(4, 16), torch.randn(4, 24)
    c = check(lambda x, r: F.gelu(lin(x)) + r, x, r)
    assert count_externs(c) == 1 and c.num_kernels == 1, c.artefacts["schedule"]


def test_siblings_share_a_kernel():
    """Horizontal fusion: independent ops over the same input and shape run in one kernel."""
    x = torch.randn(7, 9)
    c = check(lambda x: (x.sin(), x.cos(), x.sum(-1), x.amax(-1)), x)
    assert c.num_kernels == 1


def test_reduction_never_recomputed():
    """A reduction used by many consumers is computed once (one reduction loop in the kernel)."""
    x = torch.randn(4, 50)
    c = check(lambda x: (x - x.sum(-1, keepdim=True), x * x.sum(-1, keepdim=True), x.sum(-1)), x)
    src = c.artefacts["kernels.cpp"].split("extern \"C\"", 1)[1]
    assert len(re.findall(r"acc\d+ = acc\d+ \+", src)) == 1, src


def relu_backward_and_bias_gradient(x, grad):
    """A linear layer's backward through relu: the input gradient (read by matmuls) and its column sum."""
    masked = torch.where(x <= 0, 0.0, grad)
    return masked, masked.sum(0)


def test_a_column_sum_runs_in_the_kernel_of_what_it_sums():
    # the sum walks the columns and reads each value where the pointwise node computes it: the
    # pointwise node runs its [rows, columns] dims on the sum's (columns | rows) loops
    x, grad = torch.randn(8, 128), torch.randn(8, 128)
    c = check(relu_backward_and_bias_gradient, x, grad)
    assert c.num_kernels == 1, c.artefacts["schedule"]
    assert "dims on loops 1, 0" in str(c.artefacts["schedule"])


def test_the_loads_decide_the_order_of_a_square_column_sum():
    # [6, 6]: the sizes fit the sum's loops either way; only the order it reads the values in does
    x, grad = torch.randn(6, 6), torch.randn(6, 6)
    c = check(relu_backward_and_bias_gradient, x, grad)
    assert c.num_kernels == 1, c.artefacts["schedule"]
    assert "dims on loops 1, 0" in str(c.artefacts["schedule"])
    c = check(lambda x: (x * 2, (x * 2).sum(1)), x)  # a row sum keeps the dims in order
    assert c.num_kernels == 1 and "dims on loops" not in str(c.artefacts["schedule"])


def _fw_bw_kernels(fn, *inputs):
    graphs = []

    def compiler(gm, example_inputs):
        compiled = compile_aten_graph(gm, example_inputs)
        assert "fallback" not in compiled.artefacts
        graphs.append(compiled)
        return compiled

    gm = torch.fx.symbolic_trace(fn)
    compiled = aot_compile(gm, list(inputs), compiler, decompositions=decomposition_table())
    out = compiled(*inputs)
    out.sum().backward()
    return graphs


def test_layernorm_and_softmax_backward_fuse():
    x = torch.randn(6, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    b = torch.randn(32, requires_grad=True)
    fw, bw = _fw_bw_kernels(lambda x, w, b: F.layer_norm(x, (32,), w, b).softmax(-1) * 3, x, w, b)
    # eager reference for the gradients
    ref = [t.grad.clone() for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    (F.layer_norm(x, (32,), w, b).softmax(-1) * 3).sum().backward()
    for got, t in zip(ref, (x, w, b)):
        torch.testing.assert_close(got, t.grad, atol=1e-5, rtol=1e-5)
    assert fw.num_kernels <= 2, fw.artefacts["schedule"]
    # backward: row-wise part (dx) and the column sums (dw, db) over a different reduction axis
    assert bw.num_kernels <= 3, bw.artefacts["schedule"]


def test_softmax_read_through_a_reshaping_view_is_one_kernel():
    """Attention's softmax: the scores are [B, H, S, S] but the next bmm reads a [B*H, S, S] view. The
    normalizing pass is over the merged dims of the reduction kernel's loops and joins it, instead of
    a second kernel that reads the scores again (BERT's math-attention path)."""
    def attention(q, k, mask, v):
        scores = torch.bmm(q, k).view(2, 3, 16, 16) + mask
        return torch.bmm(torch.ops.aten._safe_softmax(scores, -1).view(6, 16, 16), v)

    mask = torch.zeros(2, 1, 16, 16)
    mask[1, ..., 10:] = float("-inf")
    mask[0, :, 3, :] = float("-inf")  # a fully masked row: _safe_softmax gives zeros there
    c = check(attention, torch.randn(6, 16, 8), torch.randn(6, 8, 16), mask, torch.randn(6, 16, 8))
    assert c.num_kernels == 1 and count_externs(c) == 2, c.artefacts["schedule"]


def test_layer_norm_read_through_a_flattening_view_is_one_kernel():
    """ConvNeXt's block: a layer norm over the channels of an [N, H, W, C] value whose result a linear layer
    reads as [N*H*W, C]. The normalization runs over merged dims of the statistics kernel's loops and reads
    its mean and variance at `(h*W + w) // W`-like indices, equal to the loops' own only within their bounds:
    it joins that kernel (one read of the input) instead of a second kernel reading it again."""
    def block(x, w, b, weight):
        y = torch.nn.functional.layer_norm(x, (12,), w, b)
        return torch.mm(y.view(-1, 12), weight)

    x = torch.randn(2, 5, 7, 12)
    c = check(block, x, torch.randn(12), torch.randn(12), torch.randn(12, 6))
    assert c.num_kernels == 1 and count_externs(c) == 1, c.artefacts["schedule"]


def test_simplify_in_ranges_folds_what_the_bounds_decide():
    import sympy

    from kiln.lower.index import FloorDiv, Mod, index_vars, simplify_in_ranges

    x0, x1, x2 = index_vars("x", 3)
    ranges = ((x0, 4), (x1, 56), (x2, 56))
    merged = 56 * x1 + x2
    assert simplify_in_ranges(FloorDiv(merged, 3136) + Mod(merged, 56), ranges) == x2
    assert simplify_in_ranges(Mod(x1 + FloorDiv(x2, 56), 56), ranges) == x1
    assert simplify_in_ranges(FloorDiv(merged, 56), ranges) == x1
    # what may reach the divisor, or a variable of unknown range, is left as it is
    assert simplify_in_ranges(FloorDiv(x2 + 1, 56), ranges) == FloorDiv(x2 + 1, 56)
    unknown = sympy.Symbol("s0", integer=True, nonnegative=True)
    assert simplify_in_ranges(Mod(unknown, 56), ranges) == Mod(unknown, 56)


def test_merged_runs_maps_each_dim_to_consecutive_loops():
    from kiln.schedule.fusion import merged_runs

    assert merged_runs((384, 128, 128), (32, 12, 128), (128,)) == ((0, 1), (2,), (3,))
    assert merged_runs((384, 128), (32, 12, 128), ()) == ((0, 1), (2,))
    # a dim may not span the outer loops and the reduction lanes, nor split a loop
    assert merged_runs((32, 12, 16384), (32, 12, 128), (128,)) is None
    assert merged_runs((64, 6, 128, 128), (32, 12, 128), (128,)) is None
    assert merged_runs((32, 12, 128, 128), (32, 12, 128), (128,)) is None  # the plain mapping


def _second_reduction(kind: str, v):
    """A reduction of each family over the rows of `v`: (outputs...)."""
    if kind == "var_mean":
        return torch.var_mean(v, -1)
    return (getattr(v, kind)(-1),)


@pytest.mark.parametrize("kind", ["sum", "var_mean", "amax", "argmax"])
def test_a_sibling_reduction_after_an_epilogue_shares_the_first_ones_loop(kind):
    """A second reduction joining a kernel after the first one's epilogue (an outer segment), and reading only
    what the first loop reads or computes, runs in that loop: one inner segment and its epilogue, which the GPU
    target can split across programs (batch norm's backward sums of a residual block's two branches)."""
    def fn(x, y, w):
        a = (x * 2).relu()
        return (a.sum(-1) * w, *_second_reduction(kind, a * y))

    c = check(fn, torch.randn(30, 500), torch.randn(30, 500), torch.randn(30))
    (group,) = c.artefacts["schedule"].kernels()
    assert [s.inner for s in group.segments] == [True, False], group


def test_a_loop_reading_an_epilogue_or_a_reduction_result_stays_after_it():
    """What an earlier loop cannot compute keeps its own loop after it: a sum of values centred by the epilogue
    of the first sum (an outer segment), and a sum of squares around the row mean (the first loop's result)."""
    def after_epilogue(x, w):
        centre = x.sum(-1) * w
        return centre, (x - centre[:, None]).abs().sum(-1)

    def after_reduction(x):
        return (x - x.mean(-1, keepdim=True)).square().sum(-1)

    x, w = torch.randn(30, 500), torch.randn(30)
    (group,) = check(after_epilogue, x, w).artefacts["schedule"].kernels()
    assert [s.inner for s in group.segments] == [True, False, True], group
    (group,) = check(after_reduction, x).artefacts["schedule"].kernels()
    assert [s.inner for s in group.segments][:2] == [True, True], group


def test_a_flattened_value_stays_out_of_a_reduction_that_splits_its_loops():
    """Fuzz seed 203064: `y.flatten()` ([9]) ran on the [3, 3] loops of `y.floor()` by merging them; the column sum
    `y.sum(0)` then took the kernel over, splitting the loops into (3 | 3), which no [9] dim can run on without
    crossing from the outer loop into the inner one. It ran on the outer loop alone, six of nine elements left as
    whatever the allocator held. It gets a kernel of its own."""
    def fn(x):
        y = x * 2
        return y.floor(), y.flatten(), y.sum(0, keepdim=True)

    x = torch.arange(9.0).reshape(3, 3) - 4
    c = check(fn, x)
    assert c.num_kernels == 2, c.artefacts["schedule"]



def fill_after_select(a):
    t = torch.where(a > a, a, a)
    t[..., 1:].fill_(2)
    return t


def test_values_no_one_reads_make_no_kernel(compiled_graphs):
    # `copy_` into a slice reads the slice's geometry, not its values: the slice of `where(...)`, lowered as a
    # buffer of its own, reaches nothing and made a kernel that stored nothing, run on every call
    a = torch.randn(4, 3)
    torch.testing.assert_close(kiln.compile(fill_after_select)(a), fill_after_select(a))
    assert [g.num_kernels for g in compiled_graphs] == [1]


def quotient_then_fill(a, b):
    q = a // b
    q[..., 1:].fill_(2)
    return q


def test_unread_values_that_eager_checks_still_run():
    # an integer division's zero check raises as eager does, also where the quotient is overwritten unread
    compiled = kiln.compile(quotient_then_fill)
    a = torch.tensor([[4, 5, 6]])
    torch.testing.assert_close(compiled(a, torch.tensor([[2, 1, 3]])), quotient_then_fill(a, torch.tensor([[2, 1, 3]])))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        quotient_then_fill(a, torch.tensor([[2, 1, 0]]))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(a, torch.tensor([[2, 1, 0]]))
