"""Custom ops (`torch.library.custom_op`) whose registered autograd formula reads tensor data
(kiln/autograd/opaque_backward.py): the joint graph keeps the op's backward as one call running its formula, as
eager's autograd does, and the training graph compiles (strict: no fallback). Values and gradients against eager.

The ops below are shaped like transformers' grouped matmul of mixture-of-experts layers (5.17: the backward loops
over `offs.tolist()`, the tokens per expert) and like a gather whose backward walks its index list.
"""
from __future__ import annotations

import logging

import pytest
import torch

import kiln
from kiln.autograd import aot_cache


@torch.library.custom_op("kilntest_opaque::segment_mm", mutates_args=())
def segment_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows `offs[i-1]:offs[i]` of `x` times `w[i]` (each expert's tokens by its weight)."""
    out = x.new_zeros(x.size(0), w.size(2))
    start = 0
    for i, end in enumerate(offs.tolist()):
        torch.mm(x[start:end], w[i], out=out[start:end])
        start = end
    return out


@segment_mm.register_fake
def _(x, w, offs):
    return x.new_empty(x.size(0), w.size(2))


def _segment_mm_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


def _segment_mm_backward(ctx, grad):
    x, w = ctx.saved_tensors
    grad_x, grad_w = torch.zeros_like(x), torch.zeros_like(w)
    start = 0
    for i, end in enumerate(ctx.offs.tolist()):  # a value of tensor data: no fake tensor has it
        if start == end:
            continue
        torch.mm(grad[start:end], w[i].T, out=grad_x[start:end])
        torch.mm(x[start:end].T, grad[start:end], out=grad_w[i])
        start = end
    return grad_x, grad_w, None


segment_mm.register_autograd(_segment_mm_backward, setup_context=_segment_mm_setup)


@torch.library.custom_op("kilntest_opaque::gather_scaled", mutates_args=())
def gather_scaled(x: torch.Tensor, index: torch.Tensor, scale: float,
                  bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(`x[index] * scale + bias`, the exp of each row's sum): two results, the second saved for the backward."""
    rows = x[index] * scale
    if bias is not None:
        rows = rows + bias
    return rows, rows.sum(1).exp()


@gather_scaled.register_fake
def _(x, index, scale, bias=None):
    return x.new_empty(index.size(0), x.size(1)), x.new_empty(index.size(0))


def _gather_setup(ctx, inputs, output):
    x, index, scale, _ = inputs
    ctx.save_for_backward(index, output[1])
    ctx.scale, ctx.shape = scale, x.shape


def _gather_backward(ctx, grad_rows, grad_exp):
    index, exp = ctx.saved_tensors
    grad = grad_rows + (grad_exp * exp)[:, None]
    grad_x = None
    if ctx.needs_input_grad[0]:
        grad_x = grad.new_zeros(ctx.shape)
        for row, i in enumerate(index.tolist()):
            grad_x[i] += grad[row] * ctx.scale
    has_bias = len(ctx.needs_input_grad) > 3  # eager leaves out a trailing argument equal to its default
    return grad_x, None, None, grad.sum(0) if has_bias and ctx.needs_input_grad[3] else None


gather_scaled.register_autograd(_gather_backward, setup_context=_gather_setup)


def experts(x, w, offs):
    return (torch.ops.kilntest_opaque.segment_mm(x.sin(), w, offs) * 2).relu()


def experts_by_definition(x, w, offs):
    """The op called as the object `custom_op` returned, not through torch.ops."""
    return segment_mm(x.sin(), w, offs).tanh()


def gather_with_bias(x, w, offs):
    rows, exp = torch.ops.kilntest_opaque.gather_scaled(x.cos(), offs % 6, scale=0.5, bias=w[0, :, 0])
    return rows.tanh(), exp


def gather_without_bias(x, w, offs):
    rows, _ = gather_scaled(x * w[0, 0, 0], offs - 1, 2.0)  # its second result unused: a zero gradient
    return rows


def both_ops(x, w, offs):
    return experts(x, w, offs).sum() + gather_scaled(x, offs % 6, 0.25)[1]


@torch.library.custom_op("kilntest_opaque::scaled_rows", mutates_args=())
def scaled_rows(x: torch.Tensor, index: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
    """A keyword-only constant: the formula's setup_context receives it apart (`keyword_only_inputs`)."""
    return x[index] * scale


@scaled_rows.register_fake
def _(x, index, *, scale=1.0):
    return x.new_empty(index.size(0), x.size(1))


def _scaled_rows_setup(ctx, inputs, keyword_only_inputs, output):
    ctx.index, ctx.rows, ctx.scale = inputs[1], inputs[0].size(0), keyword_only_inputs["scale"]


def _scaled_rows_backward(ctx, grad):
    grad_x = grad.new_zeros(ctx.rows, grad.size(1))
    for row, i in enumerate(ctx.index.tolist()):
        grad_x[i] += grad[row] * ctx.scale
    return grad_x, None


scaled_rows.register_autograd(_scaled_rows_backward, setup_context=_scaled_rows_setup)


def rows_by_keyword(x, w, offs):
    return scaled_rows(x.exp(), offs - 1, scale=-3.0) @ w[1]


def _inputs(w_requires_grad=True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, generator=g, requires_grad=True)
    w = torch.randn(3, 4, 5, generator=g, requires_grad=w_requires_grad)
    return x, w, torch.tensor([2, 2, 6])  # the second expert has no tokens


def _step(fn, x, w, offs):
    """Outputs and the gradients of x and w after one backward of their sum."""
    x, w = (t.detach().clone().requires_grad_(t.requires_grad) for t in (x, w))
    out = fn(x, w, offs)
    outs = out if isinstance(out, tuple) else (out,)
    sum(o.sum() for o in outs).backward()
    return [o.detach() for o in outs], [x.grad, w.grad]


@pytest.mark.sampled(every=2, classes=("fn",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fn", [experts, experts_by_definition, gather_with_bias, gather_without_bias, both_ops,
                                rows_by_keyword],
                         ids=lambda f: f.__name__)
def test_a_backward_reading_tensor_data_runs_as_eager_s(fn, backend, caplog):
    kiln.reset()
    with caplog.at_level(logging.INFO, logger="kiln.aot"):
        actual = _step(kiln.compile(fn, backend=backend, fullgraph=True), *_inputs())
    torch.testing.assert_close(actual, _step(fn, *_inputs()))
    assert "custom_op_backward" in caplog.text


@pytest.mark.parametrize("fn", [experts, gather_with_bias])
def test_an_input_without_grad_gets_none(fn):
    kiln.reset()
    actual = _step(kiln.compile(fn), *_inputs(w_requires_grad=False))
    expected = _step(fn, *_inputs(w_requires_grad=False))
    torch.testing.assert_close(actual, expected)
    assert actual[1][1] is None


@torch.library.custom_op("kilntest_opaque::square", mutates_args=())
def square(x: torch.Tensor) -> torch.Tensor:
    return x * x


@square.register_fake
def _(x):
    return torch.empty_like(x)


square.register_autograd(lambda ctx, grad: grad * 2 * ctx.saved_tensors[0],
                         setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]))


def squared(x, w, offs):
    return square(x).sum(0) * w[0, 0, 0]


def test_a_traceable_formula_is_traced_into_the_backward(caplog):
    kiln.reset()
    with caplog.at_level(logging.INFO, logger="kiln.aot"):
        actual = _step(kiln.compile(squared, backend="aot_eager"), *_inputs())
    torch.testing.assert_close(actual, _step(squared, *_inputs()))
    assert "custom_op_backward" not in caplog.text


@torch.library.custom_op("kilntest_opaque::stacked_segments", mutates_args=())
def stacked_segments(parts: list[torch.Tensor], offs: torch.Tensor) -> torch.Tensor:
    """A list of tensors as its argument: no op of this kind is covered."""
    return torch.cat(parts)[: int(offs[-1])] * 2


@stacked_segments.register_fake
def _(parts, offs):
    return torch.cat(parts) * 2


def _stacked_backward(ctx, grad):
    sizes = [int(n) for n in ctx.sizes.tolist()]
    return list(grad.split(sizes)), None


def _stacked_setup(ctx, inputs, output):
    ctx.sizes = torch.tensor([p.size(0) for p in inputs[0]])


stacked_segments.register_autograd(_stacked_backward, setup_context=_stacked_setup)


def stacked(x, w, offs):
    return stacked_segments([x[:3] * 2, x[3:]], offs) @ w[0]


@pytest.mark.allows_fallback("graph: a custom op taking a list of tensors, its formula reading tensor data")
def test_an_op_not_covered_still_runs_op_by_op(fallback_log):
    kiln.reset()
    with pytest.warns(kiln.KilnFallbackWarning, match="depends on tensor data"):
        actual = _step(kiln.compile(stacked, backend="aot_eager"), *_inputs())
    torch.testing.assert_close(actual, _step(stacked, *_inputs()))
    assert {f.kind for f in fallback_log.records()} == {"graph"}


def test_the_opaque_backward_is_taken_from_the_compile_cache(fresh_cache):
    hits = []
    for _ in range(2):
        kiln.reset()
        before = aot_cache.stats["hits"]
        actual = _step(kiln.compile(experts), *_inputs())
        hits.append(aot_cache.stats["hits"] - before)
        torch.testing.assert_close(actual, _step(experts, *_inputs()))
    assert hits == [0, 1]
