"""The min-cut partitioner: what it saves, what it recomputes, and that it never saves more than save-all."""
import functools
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.autograd.decompositions import FUNCTIONALIZATION
from kiln.autograd.functionalize import functionalize
from kiln.autograd.joint import trace_joint
from kiln.autograd.partition import JointLayout, is_recomputable, merge_duplicates, partition
from kiln.autograd.signature import FlatProgram
from kiln.lower import decompositions as kiln_decompositions
from kiln.pipeline import fuses
from support.autograd import compile_module, train_and_compare

from .test_aot import CNN, MLP, Block, ManualAttention


def mm_chain(x, w1, w2):
    y = x @ w1
    z = torch.sin(y) * 2 + 1  # sin's backward reads y; the matmul of z reads z
    return (z @ w2).sum()


def joint_graph(fn, inputs, decompositions=FUNCTIONALIZATION):
    """The functional joint graph of `fn` and its layout, as aot_compile builds them."""
    program = FlatProgram(torch.fx.symbolic_trace(fn), inputs)
    key = tuple(t.requires_grad for t in inputs)
    signature = program.analyze(key)
    joint = trace_joint(functools.partial(program.graph_function, signature), program.input_specs, key, signature,
                        {**FUNCTIONALIZATION, **decompositions})
    tangents = [signature.graph_outputs[i] for i in signature.differentiable()]
    graph, mutations = functionalize(joint.gm, program.input_specs + tangents)
    n = joint.num_outputs
    layout = JointLayout(joint.num_primals, list(range(n)) + [m.output_index for m in mutations],
                         list(range(n, n + sum(joint.grad_mask))), tuple(joint.grad_mask))
    return graph, layout


def chain_inputs():
    return [torch.randn(8, 16), torch.randn(16, 32, requires_grad=True), torch.randn(32, 4, requires_grad=True)]


def test_pointwise_chain_recomputed_and_matmul_output_saved():
    graph, layout = joint_graph(mm_chain, chain_inputs())
    split = partition(graph, layout)
    assert "mm" in split.saved  # x @ w1: expensive, saved
    assert not {"sin", "mul", "add"} & set(split.saved)  # the pointwise chain after it is not
    assert {"sin", "mul", "add"} <= set(split.recomputed)
    assert split.saved_bytes < split.naive_bytes
    naive = partition(graph, layout, strategy="naive")
    assert {"mm", "add"} <= set(naive.saved) and naive.saved_bytes == split.naive_bytes


def test_a_value_a_backward_matmul_reads_is_saved_not_recomputed():
    # The weight gradient of z @ w2 is a matmul over z: recomputed, z would be written in the backward for it,
    # a kernel and its inputs' reads, to save z's bytes. It is saved (Inductor's "materialized in backward").
    graph, layout = joint_graph(mm_chain, chain_inputs())
    split = partition(graph, layout, fused=fuses)
    assert "add" not in split.recomputed and "add" in saved_bases(split), split.summary()
    op_by_op = partition(graph, layout)  # every recomputed value is written there: least memory wins
    assert "add" in op_by_op.recomputed and "mm" in op_by_op.saved, op_by_op.summary()


def saved_bases(split) -> set[str]:
    """The names of the values `split` saves, a saved view named by its base."""
    outputs = split.forward.graph.find_nodes(op="output")[0].args[0]
    saved = outputs[len(outputs) - len(split.saved):]
    return {(n.args[0] if isinstance(n.target, torch._ops.OpOverload) and n.target.is_view else n).name
            for n in saved}


def conv_relu_pool(x, w):
    return F.max_pool2d(torch.relu(F.conv2d(x, w, padding=1)), 2).sum()


def conv_inputs():
    return [torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3, requires_grad=True)]


def fuses_all_but_convolutions(target) -> bool:
    return target not in (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)


@pytest.mark.parametrize("fn, make_inputs, strategy, fused", [
    (mm_chain, chain_inputs, "min_cut", None), (mm_chain, chain_inputs, "naive", None),
    (conv_relu_pool, conv_inputs, "min_cut", fuses_all_but_convolutions)])
def test_forward_then_backward_graphs_compute_what_the_joint_computes(fn, make_inputs, strategy, fused):
    inputs = make_inputs()
    graph, layout = joint_graph(fn, inputs)
    split = partition(graph, layout, strategy=strategy, fused=fused)
    tangent = torch.tensor(1.5)
    expected = graph(*inputs, tangent)
    forward_out = split.forward(*inputs)
    num_saved = len(split.saved)
    saved = forward_out[len(forward_out) - num_saved:]
    grads = split.backward(*saved, tangent)
    torch.testing.assert_close(forward_out[0], expected[0])
    for got, want in zip(grads, [expected[i] for i in layout.backward_outputs]):
        torch.testing.assert_close(got, want)


def test_backward_graph_reads_no_primal_that_is_not_saved():
    graph, layout = joint_graph(mm_chain, chain_inputs())
    split = partition(graph, layout)
    placeholders = [n.name for n in split.backward.graph.find_nodes(op="placeholder")]
    assert placeholders == split.saved + ["arg3_1"]  # saved tensors, then the tangent


@pytest.mark.parametrize("model, shape", [(MLP, (5, 8)), (CNN, (2, 3, 8, 8)), (Block, (2, 5, 16)),
                                          (ManualAttention, (2, 5, 16))])
def test_never_saves_more_bytes_than_save_all(model, shape):
    torch.manual_seed(0)
    compiled = compile_module(model(), [torch.randn(*shape)])
    (split,) = compiled.partitions.values()
    assert 0 < split.saved_bytes <= split.naive_bytes


def test_random_ops_are_never_recomputed():
    class Drop(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return F.dropout(torch.tanh(self.lin(x)), p=0.3, training=True).sum()

    compiled = compile_module(Drop(), [torch.randn(4, 8)])
    (split,) = compiled.partitions.values()
    for node in split.backward.graph.nodes:
        if isinstance(node.target, torch._ops.OpOverload):
            assert torch.Tag.nondeterministic_seeded not in node.target.tags, node.format_node()


def test_recomputable_ops_table():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    nodes = {op: graph.call_function(op, (x,)) for op in [
        torch.ops.aten.relu.default, torch.ops.aten.t.default, torch.ops.aten.sum.default,
        torch.ops.aten.bernoulli.default]}
    assert is_recomputable(nodes[torch.ops.aten.relu.default])
    assert is_recomputable(nodes[torch.ops.aten.t.default])
    assert not is_recomputable(nodes[torch.ops.aten.sum.default])
    assert not is_recomputable(nodes[torch.ops.aten.bernoulli.default])
    mm = graph.call_function(torch.ops.aten.mm.default, (x, x))
    assert not is_recomputable(mm)


class ResidualStack(nn.Module):
    """Pre-norm residual blocks, x1 = x0 + f(norm(x0)), x2 = x1 + f(norm(x1)), ... as in ViT and GPT.
    With `branch_dtype` the branches run in it, as under autocast: saving a branch's output then
    costs less than saving the stream, which is what tempts a min-cut to recompute the stream."""

    def __init__(self, d=16, depth=6, branch_dtype=None):
        super().__init__()
        self.branch_dtype = branch_dtype
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(depth))
        self.lins = nn.ModuleList(nn.Linear(d, d) for _ in range(depth))
        if branch_dtype is not None:
            self.lins.to(branch_dtype)

    def forward(self, x):
        for norm, lin in zip(self.norms, self.lins):
            if self.branch_dtype is None:
                x = x + lin(norm(x))
            else:
                x = x + lin(norm(x).to(self.branch_dtype)).to(x.dtype)
        return x.sum()


def test_a_residual_stream_is_not_recomputed_link_by_link():
    # The backward starts at the last block, so recomputing x6 from x0 and the branch outputs
    # would compute every link first and hold them all: each recomputed link must come from a
    # saved one instead.
    x = torch.randn(4, 16)
    compiled = compile_module(ResidualStack(branch_dtype=torch.bfloat16), [x])
    (split,) = compiled.partitions.values()
    recomputed = set(split.recomputed)
    links = [n for n in split.backward.graph.nodes if n.name in recomputed and n.target is torch.ops.aten.add.Tensor
             and all(isinstance(a, torch.fx.Node) and a.meta["val"].shape == x.shape for a in n.args)]
    assert links, "some links are still recomputed (every other one saves memory)"
    for link in links:
        assert not any(a in links for a in link.args), link.format_node()
    assert split.saved_bytes <= split.naive_bytes


def test_a_residual_stack_trains_like_eager():
    train_and_compare(ResidualStack, lambda: [torch.randn(4, 16)], lambda out: out)


def test_a_fusing_compiler_saves_the_convolution_output_rather_than_its_relu():
    # relu(conv) and conv are the same size. Op by op either may be saved (the cut nearest the sink
    # saves relu); a compiler that fuses relu into the pool stores relu only if it is saved, while the
    # convolution's output is in memory anyway.
    graph, layout = joint_graph(conv_relu_pool, conv_inputs())
    op_by_op = partition(graph, layout)
    assert "relu" in op_by_op.saved and "convolution" not in op_by_op.saved
    fused = partition(graph, layout, fused=fuses_all_but_convolutions)
    assert "convolution" in fused.saved and "relu" not in fused.saved
    assert "relu" in fused.recomputed
    assert fused.saved_bytes == op_by_op.saved_bytes


def test_a_convolution_bias_taken_apart_is_recomputed_from_the_saved_convolution():
    # kiln adds a convolution's bias apart (kiln.lower.decompositions): relu(conv + b) is recomputed in the
    # backward from the convolution's output and the bias, a parameter, which costs the cut nothing to save.
    def conv_bias_relu_pool(x, w, b):
        return F.max_pool2d(torch.relu(F.conv2d(x, w, b, padding=1)), 2).sum()

    inputs = conv_inputs() + [torch.randn(4, requires_grad=True)]
    graph, layout = joint_graph(conv_bias_relu_pool, inputs, kiln_decompositions.OWN)
    split = partition(graph, layout, fused=fuses_all_but_convolutions)
    assert "convolution" in split.saved and "relu" not in split.saved, split.saved
    bias_grad = [n for n in split.backward.graph.nodes if n.target is torch.ops.aten.sum.dim_IntList]
    assert bias_grad, split.backward.code


def test_a_value_an_extern_reads_is_saved_as_it_is():
    # relu(conv) read by a second convolution is stored for it anyway: recomputing it in the
    # backward, for the second convolution's weight gradient, would store it a second time.
    def conv_relu_conv(x, w, w2):
        return F.conv2d(torch.relu(F.conv2d(x, w, padding=1)), w2, padding=1).sum()

    graph, layout = joint_graph(conv_relu_conv, conv_inputs() + [torch.randn(5, 4, 3, 3, requires_grad=True)])
    split = partition(graph, layout, fused=fuses_all_but_convolutions)
    assert "relu" in split.saved and "relu" not in split.recomputed


def two_projections_of_one_input(x, w1, w2):
    # autocast's spelling of a gated MLP's gate and up projections: x cast to bf16 once per linear
    a = x.to(torch.bfloat16) @ w1.to(torch.bfloat16)
    b = x.to(torch.bfloat16) @ w2.to(torch.bfloat16)
    return (a * b).float().sum()


def test_identical_casts_of_one_input_are_merged_and_saved_once():
    inputs = [torch.randn(8, 16), torch.randn(16, 32, requires_grad=True), torch.randn(16, 32, requires_grad=True)]
    graph, layout = joint_graph(two_projections_of_one_input, inputs)
    split = partition(graph, layout, fused=fuses)
    outputs = split.forward.graph.find_nodes(op="output")[0].args[0]
    casts_of_x = [n for n in outputs[len(outputs) - len(split.saved):]
                  if n.meta["val"].dtype == torch.bfloat16 and tuple(n.meta["val"].shape) in ((8, 16), (16, 8))]
    assert len(casts_of_x) == 1, split.summary()
    expected = graph(*inputs, torch.tensor(1.0))  # the merged joint graph still computes the same
    forward_out = split.forward(*inputs)
    grads = split.backward(*forward_out[1:], torch.tensor(1.0))
    reference = [torch.autograd.grad(two_projections_of_one_input(*inputs), inputs[1:])]
    for got, want in zip(grads, reference[0]):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(forward_out[0], expected[0])


def test_identical_outputs_stay_apart():
    # two outputs computed alike are two tensors to the caller (writing one must not change the other); a third
    # cast alike that is no output is merged into the first
    def three_casts(x, w):
        y = x * w
        return y.to(torch.bfloat16), y.to(torch.bfloat16), y.to(torch.bfloat16) + 1

    graph = make_fx(three_casts)(torch.randn(4), torch.randn(4))
    merge_duplicates(graph)
    outputs = graph.graph.find_nodes(op="output")[0].args[0]
    assert outputs[0] is not outputs[1]
    assert len(graph.graph.find_nodes(op="call_function", target=torch.ops.aten._to_copy.default)) == 2, graph.code


def two_bit_views_alike(a):
    """Fuzz seed 210311: two values computed alike, each returned through a view (a dtype view, a view of that)."""
    t = a * 0
    first = (t.half() + 1).view(torch.int16)
    second = (t.half() + 1).view(torch.int16)
    return t, first, second[...]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_bases_of_returned_views_stay_apart(backend):
    # the second `t.half() + 1` is no output, but the storage of one is: merged into the first, the two returned
    # views shared one storage, and writing one changed the other
    a = torch.randn(1, 3, requires_grad=True)
    expected, got = two_bit_views_alike(a), kiln.compile(two_bit_views_alike, backend=backend)(a)
    assert got[1].untyped_storage().data_ptr() != got[2].untyped_storage().data_ptr()
    got[1].add_(1)
    expected[1].add_(1)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("op", ["cholesky", "eigh", "qr", "svd"])
def test_returned_factors_eager_saves_are_saved_once_with_their_views(op):
    """A factorization's results are returned and saved by eager's backward (read as returned): their transposes
    are views recomputed from the saved factor, not saved apart (the min cut saved them at the factor's cost again
    and cost more than saving all, which the partition refuses); gradients are eager's."""
    fn = {"cholesky": lambda x: torch.linalg.cholesky(x @ x.mT + torch.eye(3, dtype=x.dtype)),
          "eigh": lambda x: torch.linalg.eigh(x + x.mT),
          "qr": lambda x: torch.linalg.qr(x), "svd": lambda x: torch.linalg.svd(x)}[op]
    x = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    kiln.reset()
    expected, got = fn(x), kiln.compile(fn)(x)
    expected, got = (expected, got) if isinstance(expected, tuple) else ((expected,), (got,))
    loss = [sum(o.sin().sum() for o in outs) for outs in (expected, got)]
    torch.testing.assert_close(torch.autograd.grad(loss[1], x)[0], torch.autograd.grad(loss[0], x)[0])


def complex_scaled_by_a_size(a):
    """Fuzz seed 402194: a complex value times the square root of a symbolic size, a float no tensor holds, which
    the complex multiplication's backward reads on both sides of a kernel boundary (its reads span epochs)."""
    t0 = (a.to(torch.complex64) * math.sqrt(a.shape[-1])).real
    t1 = t0 * 1.5 + 0.5
    return t0, t1, t1.exp() * t1.sigmoid()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_float_of_sizes_read_across_the_backward_is_recomputed(backend):
    """Recomputing the float from the sizes is the only way the backward can have it: a cut that banned it
    failed the whole graph (max-flow found an infinite path). The second size recompiles with symbolic sizes."""
    compiled = kiln.compile(complex_scaled_by_a_size, backend=backend)
    for n in (5, 2, 7):
        a = torch.randn(n, generator=torch.Generator().manual_seed(n)).bfloat16().requires_grad_()
        b = a.detach().clone().requires_grad_()
        got, expected = compiled(a), complex_scaled_by_a_size(b)
        sum(t.float().sum() for t in got).backward()
        sum(t.float().sum() for t in expected).backward()
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e)
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize(("reduce", "through"), [
    (lambda t: t.amax(0), torch.log1p), (lambda t: t.amin(-1), torch.tanh), (lambda t: t.max(), torch.sin),
], ids=["amax-log1p", "amin-tanh", "max-sin"])
def test_the_elements_a_max_picked_are_found_by_the_forwards_own_bits(reduce, through):
    """A max's gradient goes to the elements equal to it (`x == amax(x)`), a comparison only the backward needs.
    Recomputed in the backward, `log1p(|b|)` need not have the bits the forward's kernel gave it (a vectorized and
    a scalar loop differ by an ulp): no element equalled the saved max, and the gradient divided by a count of 0,
    inf and NaN where eager has finite values (fuzz seed 96677). The comparison's operands are kept from
    recomputation: the backward compares the forward's bits."""
    def fn(b):
        return reduce(through(b.abs()))

    b = torch.randn(3, 8, 37, generator=torch.Generator().manual_seed(0), requires_grad=True)
    kiln_b = b.detach().clone().requires_grad_()
    fn(b).sum().backward()
    kiln.compile(fn)(kiln_b).sum().backward()
    torch.testing.assert_close(kiln_b.grad, b.grad)
