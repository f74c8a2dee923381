"""Symbolic sizes through the autograd stage: one compilation serves every size its guards admit."""
import torch
from torch import nn

import kiln
from kiln.api import context_of
from kiln.autograd.aot import AOTCompiled


class Reshaping(nn.Module):
    """Sizes read from the input: with dynamic=True the batch is a symbol in every graph."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(12, 4)

    def forward(self, x):
        n = x.size(0)
        return self.lin(x.view(n, -1)).view(n, 2, 2).relu() * n


def the_compiled_graph(compiled):
    records = context_of(compiled).records
    assert len(records) == 1, [r.name for r in records]
    return records[0].compiled


def test_one_training_compilation_serves_every_batch_size():
    torch.manual_seed(0)
    model, reference = Reshaping(), Reshaping()
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, backend="inductor", dynamic=True)
    for batch in (3, 5, 8, 3):
        x = torch.randn(batch, 2, 6)  # no size equal to another: duck sizing would tie them
        out, expected = compiled(x), reference(x)
        torch.testing.assert_close(out, expected)
        out.sum().backward()
        expected.sum().backward()
        torch.testing.assert_close(model.lin.weight.grad, reference.lin.weight.grad)
        torch.testing.assert_close(model.lin.bias.grad, reference.lin.bias.grad)
    aot = the_compiled_graph(compiled)
    assert isinstance(aot, AOTCompiled) and aot.specialized is None
    assert len(aot.runners) == 1
    assert [g.artefacts.get("fallback") for g in aot.compiled_graphs] == [None, None]  # kernels, not ATen


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 4)

    def forward(self, x):
        h = self.lin(x)
        return h.relu(), h.sum()


def test_an_output_the_loss_does_not_reach_gets_zeros_of_its_symbolic_size():
    model = TwoHeads()
    compiled = kiln.compile(model, backend="inductor", dynamic=True)
    for batch in (3, 5):
        model.zero_grad()
        _, total = compiled(torch.ones(batch, 6))
        total.backward()  # the relu head gets no gradient: the backward reads zeros of size [batch, 4]
        torch.testing.assert_close(model.lin.bias.grad, torch.full((4,), float(batch)))


def flatten_relu_scale(x):
    return x.reshape(-1).relu() * x.shape[0]


def test_backward_receives_the_sizes_its_inputs_do_not_carry():
    """The backward sees only flattened tensors (size n*m): the forward hands it n as an int."""
    compiled = kiln.compile(flatten_relu_scale, backend="inductor", dynamic=True)
    for n, m in ((3, 4), (6, 5), (2, 7)):
        x = torch.randn(n, m, requires_grad=True)
        ref = x.detach().clone().requires_grad_(True)
        out = compiled(x)
        torch.testing.assert_close(out, flatten_relu_scale(ref))
        grad = torch.randn_like(out)
        out.backward(grad)
        flatten_relu_scale(ref).backward(grad)
        torch.testing.assert_close(x.grad, ref.grad)
    aot = the_compiled_graph(compiled)
    (split,) = aot.partitions.values()
    assert any(split.saved_is_size), split.summary()


def transpose_and_sine(x):
    return x.t(), x.sin()


def test_an_output_viewing_an_input_with_symbolic_sizes_compiles_once():
    """The view's geometry is computed per call from the input's sizes: one symbolic compilation."""
    compiled = kiln.compile(transpose_and_sine, backend="inductor", dynamic=True)
    for shape in ((3, 4), (5, 2), (3, 4)):
        x = torch.randn(shape)
        view, sine = compiled(x)
        assert view._base is x  # a real view of the input, as in eager
        assert view.stride() == x.t().stride()
        torch.testing.assert_close(view, x.t())
        torch.testing.assert_close(sine, x.sin())
    graph = the_compiled_graph(compiled)
    assert isinstance(graph, AOTCompiled) and graph.specialized is None


def first_half_variance(a):
    return a[:round(a.shape[0] / 2)].var(0), a * 1.5


def test_a_variance_over_as_many_elements_as_its_correction_gives_eagers_nan_gradient():
    """The backward of `var` divides by `n - correction`: over symbolic sizes Python's division raised
    ZeroDivisionError while the joint graph was traced at n = 1, where eager's C++ gives inf and a NaN gradient
    (fuzz seed 573394, a crash). Such a graph compiles with static sizes instead."""
    for n in (2, 4):
        a = torch.randn(n, requires_grad=True)
        kiln_a = a.detach().clone().requires_grad_()
        want = first_half_variance(a)
        got = kiln.compile(first_half_variance, dynamic=True)(kiln_a)
        torch.testing.assert_close(got, want, equal_nan=True)
        sum(t.sum() for t in want).backward()
        sum(t.sum() for t in got).backward()
        torch.testing.assert_close(kiln_a.grad, a.grad, equal_nan=True)
