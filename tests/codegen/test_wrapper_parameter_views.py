"""A view of a parameter that an extern reads (a linear layer's weight transposed for `mm`) is made once per
parameter, not once per call (`ParameterView`), and a compiled model still returns what eager returns when the
user edits, replaces or drops its weights."""
from __future__ import annotations

import gc

import torch
from torch import nn

import kiln
from kiln.codegen.wrapper import ParameterView


def _views(graph) -> list[ParameterView]:
    return [v for v in graph.call.__globals__.values() if isinstance(v, ParameterView)]


def _compiled_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    return model, kiln.compile(model), torch.randn(4, 16)


def test_an_inference_graph_makes_each_weights_view_once(compiled_graphs):
    model, compiled, x = _compiled_mlp()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        (graph,) = compiled_graphs
        views = _views(graph)
        assert len(views) == 2, graph.artefacts["wrapper.py"]  # the two weights, transposed for addmm
        first = [v.kept[id(p)][2] for v, p in zip(views, (model[0].weight, model[2].weight))]
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
        assert [v.kept[id(p)][2] for v, p in zip(views, (model[0].weight, model[2].weight))] == first


def test_weights_changed_in_place_replaced_or_moved_are_seen():
    model, compiled, x = _compiled_mlp()
    with torch.no_grad():
        compiled(x)
        model[0].weight.mul_(-2)  # the kept view reads the same storage
        torch.testing.assert_close(compiled(x), model(x))
        model[0].weight.data = torch.randn(32, 16)  # the parameter's data moved: a new view
        torch.testing.assert_close(compiled(x), model(x))
        model[2].weight = nn.Parameter(torch.randn(8, 32))  # another parameter object
        torch.testing.assert_close(compiled(x), model(x))


def test_a_dropped_parameters_view_goes_with_it(compiled_graphs):
    model, compiled, x = _compiled_mlp()
    with torch.no_grad():
        compiled(x)
        (graph,) = compiled_graphs
        model[0].weight = nn.Parameter(torch.randn(32, 16))
        compiled(x)
    gc.collect()
    assert all(len(v.kept) == 1 for v in _views(graph))  # the replaced weight's entry is gone


def test_training_steps_with_an_optimizer_match_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))
    reference = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8))
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for _ in range(3):  # the optimizer writes the weights in place between calls
        x = torch.randn(4, 16)
        for fn, opt in zip((compiled, reference), opts):
            fn(x).square().sum().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b)


def test_tensors_that_are_not_parameters_get_a_view_per_call():
    view = ParameterView((3, 2), (1, 3), 0)
    t = torch.randn(2, 3)
    assert torch.equal(view(t), t.t()) and not view.kept
    p = nn.Parameter(torch.randn(2, 3))
    with torch.no_grad():
        assert view(p) is view(p) and torch.equal(view(p), p.t())


def test_with_grad_mode_on_the_view_records_autograd_history():
    """A backward that builds a graph of its own (create_graph=True) runs its wrapper with grad mode on."""
    view = ParameterView((3, 2), (1, 3), 0)
    p = nn.Parameter(torch.randn(2, 3))
    with torch.no_grad():
        view(p)  # kept
    made = view(p)
    assert made.requires_grad and made.grad_fn is not None
    made.sum().backward()
    torch.testing.assert_close(p.grad, torch.ones(2, 3))


def test_double_backward_through_a_linear_layer_matches_eager():
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    compiled = kiln.compile(model)
    results = []
    for fn in (compiled, model):
        (gx,) = torch.autograd.grad(fn(x).tanh().sum(), x, create_graph=True)
        results.append(torch.autograd.grad(gx.square().sum(), model.weight))
    torch.testing.assert_close(results[0], results[1])
