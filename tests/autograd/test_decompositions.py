"""The decomposition tables tracing applies: the caller's, over functionalization's."""
import pytest
import torch

from kiln.autograd.decompositions import FUNCTIONALIZATION, core_aten, tracing_table
from kiln.lower.decompositions import (
    convolution_backward_bias_apart,
    convolution_bias_apart,
    decomposes,
    decomposition_table,
)
from support.autograd import run_as_is, train_and_compare

from .test_aot import Block

aten = torch.ops.aten


def test_tracing_table_always_holds_functionalization_decompositions():
    assert aten.native_batch_norm.default in tracing_table(None, training=False)
    table = tracing_table({aten.gelu.default: lambda x: x}, training=True)
    assert set(FUNCTIONALIZATION) <= set(table) and aten.gelu.default in table


def test_training_keeps_fused_attention_whose_decomposition_breaks_its_backward():
    sdpa_cpu = aten._scaled_dot_product_flash_attention_for_cpu.default
    assert sdpa_cpu in core_aten() and sdpa_cpu in tracing_table(core_aten(), training=False)
    assert sdpa_cpu not in tracing_table(core_aten(), training=True)


def test_core_aten_decomposition_trains_like_eager_and_decomposes_backward_ops():
    run_as_is.graphs.clear()
    train_and_compare(Block, lambda: [torch.randn(2, 5, 16)], lambda out: out.pow(2).mean(),
                      compile_kwargs={"decompositions": core_aten()})
    targets = {n.target for gm, _ in run_as_is.graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.native_layer_norm_backward.default not in targets and aten.t.default not in targets
    assert aten.native_layer_norm.default in targets  # a core op: kept


# ----------------------------------------------------------------------------- a convolution's bias, apart
# kiln.lower.decompositions.OWN: the bias is added (forward) and summed (backward) outside the convolution,
# so both fuse with the ops around it; the results are ATen's.

CONVOLUTIONS = {  # name: (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    "conv2d": ((2, 4, 9, 9), (6, 4, 3, 3), 6, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
    "strided grouped conv2d": ((2, 4, 9, 9), (6, 2, 3, 3), 6, [2, 2], [0, 1], [1, 1], False, [0, 0], 2),
    "conv1d": ((3, 2, 11), (5, 2, 4), 5, [1], [2], [1], False, [0], 1),
    "transposed conv2d": ((2, 4, 5, 5), (4, 3, 3, 3), 3, [2, 2], [1, 1], [1, 1], True, [1, 1], 1),
}


def _convolution_args(name):
    x, w, c, *rest = CONVOLUTIONS[name]
    torch.manual_seed(0)
    return (torch.randn(x, dtype=torch.float64), torch.randn(w, dtype=torch.float64),
            torch.randn(c, dtype=torch.float64), *rest)


@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_a_convolution_with_its_bias_apart_equals_aten(name):
    args = _convolution_args(name)
    torch.testing.assert_close(convolution_bias_apart(*args), aten.convolution.default(*args))
    assert convolution_bias_apart(args[0], args[1], None, *args[3:]) is NotImplemented


@pytest.mark.parametrize("name", CONVOLUTIONS)
@pytest.mark.parametrize("mask", [[True, True, True], [False, True, True], [False, False, True]])
def test_a_convolution_backward_with_the_bias_gradient_apart_equals_aten(name, mask):
    x, w, b, *rest = _convolution_args(name)
    grad = torch.randn_like(aten.convolution.default(x, w, b, *rest))
    args = (grad, x, w, list(b.shape), *rest)
    got, ref = convolution_backward_bias_apart(*args, mask), aten.convolution_backward.default(*args, mask)
    for k in range(3):
        assert (got[k] is None) == (not mask[k])
        if mask[k]:
            torch.testing.assert_close(got[k], ref[k])
    assert convolution_backward_bias_apart(*args, [True, True, False]) is NotImplemented


class ConvBiasReLU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


def test_training_with_the_bias_apart_matches_eager_and_sums_the_bias_gradient_in_the_graph():
    run_as_is.graphs.clear()
    train_and_compare(ConvBiasReLU, lambda: [torch.randn(2, 3, 6, 6)], lambda out: out.pow(2).mean(),
                      compile_kwargs={"decompositions": decomposition_table()})
    nodes = [n for gm, _ in run_as_is.graphs for n in gm.graph.nodes if n.op == "call_function"]
    convolutions = [n for n in nodes if n.target is aten.convolution.default]
    backwards = [n for n in nodes if n.target is aten.convolution_backward.default]
    assert convolutions and all(n.args[2] is None for n in convolutions)
    assert backwards and all(n.args[10][2] is False for n in backwards)
    assert not any(decomposes(n) for n in nodes)  # a traced graph needs no second trace


# ----------------------------------------------------------------------------- ops kept for their ATen kernel
class Embedder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)

    def forward(self, ids):
        return self.embed(ids) * 2


def test_an_embedding_backward_runs_atens_kernel_not_an_accumulating_index_put():
    """The code generator's table keeps embedding_dense_backward (ATen's sorted segment sum) rather than its
    decomposition into index_put(accumulate=True), ATen's slow generic path; gradients stay eager's,
    repeated indices included."""
    assert not decomposes(torch.fx.Node(torch.fx.Graph(), "e", "call_function",
                                        aten.embedding_dense_backward.default, (), {}))
    run_as_is.graphs.clear()
    train_and_compare(Embedder, lambda: [torch.tensor([[1, 3, 3], [49, 1, 0]])], lambda out: out.pow(2).sum(),
                      compile_kwargs={"decompositions": decomposition_table()})
    targets = {n.target for gm, _ in run_as_is.graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.embedding_dense_backward.default in targets
    assert aten.index_put.default not in targets
