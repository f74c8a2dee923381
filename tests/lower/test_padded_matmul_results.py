"""A matmul that shape padding runs padded keeps its padded rows (kiln/lower/shape_padding.py).

On CUDA, a compute-bound matmul with an unaligned N (GPT-2's vocabulary, 50257) runs on zero-padded operands
and returns the product's slice `out[:, :N]`, rows `N` rounded up apart. torch.compile returns that slice as
the graph's output (its `pad_mm` pass runs before it records the output strides); kiln did the same matmul
and then copied the result to contiguous rows, a pass over the logits every step. These graphs are lowered as
the GPU would lower them (padding on, the Triton target's `prepare` told the device is CUDA) and run on the
CPU: the C++ kernels and the padded ATen matmul compute the same values there.
"""
from __future__ import annotations

import torch

from kiln.codegen.describe import name_kernels
from kiln.codegen.target import select_target
from kiln.codegen.triton import templates
from kiln.lower import ir, lower_graph
from kiln.pipeline import build, generate
from kiln.schedule.fusion import schedule
from kiln.schedule.memory import plan_memory
from support.lowering import assert_same, trace

HALF = torch.float16


def lowered_for_cuda(fn, *inputs, alias_bases=()):
    """`fn`'s graph lowered and prepared as on a GPU with shape padding, its kernels built for the CPU: (the
    lowered graph, the compiled call over a list of inputs). `alias_bases`: the outputs kiln.autograd says
    other outputs are rebuilt on (`gm.meta["kiln.aot"]["alias_bases"]`)."""
    gm = trace(fn, *inputs)
    if alias_bases:
        gm.meta["kiln.aot"] = {"alias_bases": alias_bases}
    graph = lower_graph(gm, list(inputs), pad_matmul_operands=True)
    templates.prepare(graph, "cuda", max_autotune=False, shape_padding=True)
    sched = schedule(graph, {}, epilogue_fusion=True)
    name_kernels(sched)
    target = select_target(gm, list(inputs), "cpp")
    namespace = build(generate(sched, plan_memory(sched), target), target, "padded")
    return graph, namespace["call"]


def operands(m=512, k=512, n=515, batch=None):
    """fp16 operands of a matmul worth padding (compute-bound: `templates.worth_padding`) with an odd N."""
    g = torch.Generator().manual_seed(0)
    lead = () if batch is None else (batch,)
    a = torch.randn(*lead, m, k, generator=g, dtype=HALF) / 8
    return a, torch.randn(*lead, k, n, generator=g, dtype=HALF) / 8


def padded_externs(graph) -> list:
    return [n for n in graph.nodes if isinstance(getattr(n, "op", None), templates.PaddedMatmul)]


def test_returned_logits_keep_the_padded_rows():
    """The graph output is the padded product's slice itself: rows 520 apart (515 padded to 8), no copy."""
    x, w = operands()
    graph, call = lowered_for_cuda(lambda x, w: x @ w, x, w)
    (mm,) = padded_externs(graph)
    assert tuple(mm.layout.stride) == (520, 1)
    out = call([x, w])[0]
    assert out.stride() == (520, 1)
    assert_same(out, x @ w)


def test_views_of_the_padded_result_are_returned_as_views():
    """A reshape that eager makes a view (the logits unflattened to [batch, seq, vocab]) stays one of the padded
    rows, as torch.compile's would; one that cannot be a view of them (flattened whole) is computed with
    eager's strides."""
    x, w = operands()
    graph, call = lowered_for_cuda(lambda x, w: ((x @ w).view(2, 256, 515), (x @ w).view(-1)), x, w)
    unflat, flat = call([x, w])
    assert unflat.stride() == (256 * 520, 520, 1)
    assert flat.stride() == (1,)
    assert_same((unflat, flat), ((x @ w).view(2, 256, 515), (x @ w).view(-1)))


def test_an_output_other_outputs_view_keeps_eager_strides():
    """The runtime rebuilds outputs that view another output (`logits, logits[:, -1]`) on it at their traced
    geometry (kiln/autograd/signature.py `OutputAlias`): that base is returned with eager's contiguous rows,
    or the rebuilt views would read the wrong elements."""
    x, w = operands()
    _, call = lowered_for_cuda(lambda x, w: (x @ w, (x @ w) * 2), x, w, alias_bases=(0,))
    base, other = call([x, w])
    assert base.stride() == (515, 1) and other.stride() == (515, 1)
    assert_same((base, other), (x @ w, (x @ w) * 2))
    _, call = lowered_for_cuda(lambda x, w: x @ w, x, w, alias_bases=(0,))
    assert call([x, w])[0].stride() == (515, 1)


def test_kernels_read_the_padded_rows():
    """Pointwise and reduction kernels after the matmul (a softmax over the vocabulary, a bias add) index the
    padded rows: the values equal eager's."""
    x, w = operands()
    b = torch.randn(515, dtype=HALF)

    def fn(x, w, b):
        logits = x @ w
        return logits.float().softmax(-1), logits + b

    _, call = lowered_for_cuda(fn, x, w, b)
    assert_same(call([x, w, b]), fn(x, w, b))


def test_batched_and_biased_matmuls():
    """bmm's result is padded per batch (rows 520 apart, batches 512 x 520 apart); addmm's bias is padded
    with the product."""
    a, b = operands(batch=2)
    _, call = lowered_for_cuda(torch.bmm, a, b)
    out = call([a, b])[0]
    assert out.stride() == (512 * 520, 520, 1)
    assert_same(out, torch.bmm(a, b))
    x, w = operands()
    bias = torch.randn(515, dtype=HALF)
    _, call = lowered_for_cuda(lambda bias, x, w: torch.addmm(bias, x, w), bias, x, w)
    out = call([bias, x, w])[0]
    assert out.stride() == (520, 1)
    assert_same(out, torch.addmm(bias, x, w))


def test_aligned_or_memory_bound_matmuls_stay_contiguous():
    """No padding, no padded strides: N already aligned (512), or a matmul too small for padding to pay."""
    for m, k, n in ((512, 515, 512), (64, 64, 67)):
        x, w = operands(m, k, n)
        graph, call = lowered_for_cuda(lambda x, w: x @ w, x, w)
        out = call([x, w])[0]
        assert out.is_contiguous()
        assert_same(out, x @ w)
        externs = [nd for nd in graph.nodes if isinstance(nd, ir.Extern)]
        assert all(nd.layout.stride[-2] == n for nd in externs)


def test_cpu_graphs_are_never_padded():
    x, w = operands()
    graph = lower_graph(trace(lambda x, w: x @ w, x, w), [x, w])
    (mm,) = [n for n in graph.nodes if isinstance(n, ir.Extern)]
    assert tuple(mm.layout.stride) == (515, 1)
