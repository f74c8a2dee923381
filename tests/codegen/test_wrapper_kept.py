"""Kernels that read parameters alone (an inference graph's weight transforms) run once per parameter version.

The wrapper keeps their results across calls (`ParameterDerived`) and recomputes them when a parameter
is replaced or changed in place, so a compiled model still returns what eager returns after the user
edits its weights.
"""
from __future__ import annotations

import torch
from torch import nn

import kiln
from kiln.codegen.wrapper import ParameterDerived


class ScaledLinear(nn.Module):
    """`weight * sigmoid(scale)` reads parameters alone: one kernel, whose result an inference graph keeps."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 16))
        self.scale = nn.Parameter(torch.randn(8, 1))

    def forward(self, x):
        return x @ (self.weight * self.scale.sigmoid()).t() + 1


def compiled_and_called():
    """A ScaledLinear, kiln's compilation of it, and an input it has been called with once (inference)."""
    torch.manual_seed(0)
    model = ScaledLinear()
    compiled = kiln.compile(model)
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    return model, compiled, x


def test_a_kernel_reading_only_parameters_runs_once(compiled_graphs):
    model, compiled, _ = compiled_and_called()
    (graph,) = compiled_graphs
    assert "ParameterDerived(" in graph.artefacts["wrapper.py"]
    (derived,) = graph.kept
    (kept,) = derived.kept.values()  # one set of parameters
    first_key, first = kept.key, [t.data_ptr() for t in kept.values]
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 16)
            torch.testing.assert_close(compiled(x), model(x))
    assert kept.key is first_key  # not recomputed
    assert [t.data_ptr() for t in kept.values] == first  # not moved


def test_a_parameter_changed_in_place_is_seen():
    model, compiled, x = compiled_and_called()
    with torch.no_grad():
        model.weight.mul_(-2)  # no guard sees this: the version counter does
        torch.testing.assert_close(compiled(x), model(x))
        model.scale.copy_(torch.randn(8, 1))
        torch.testing.assert_close(compiled(x), model(x))


def test_a_replaced_parameter_is_seen():
    model, compiled, x = compiled_and_called()
    with torch.no_grad():
        model.weight = nn.Parameter(torch.randn(8, 16))
        torch.testing.assert_close(compiled(x), model(x))


def test_instances_sharing_one_graph_keep_their_own_results(compiled_graphs):
    """Two ScaledLinear layers called in turn run one graph (a module is guarded by its class): each keeps its own
    results, computed once, and each computes with its own weights."""
    torch.manual_seed(0)
    first, second = ScaledLinear(), ScaledLinear()
    compiled = kiln.compile(lambda layer, x: layer(x))
    with torch.no_grad():
        for _ in range(3):
            for layer in (first, second):
                x = torch.randn(4, 16)
                torch.testing.assert_close(compiled(layer, x), layer(x))
    (graph,) = compiled_graphs
    (derived,) = graph.kept
    assert len(derived.kept) == 2
    keys = [kept.key for kept in derived.kept.values()]
    with torch.no_grad():
        compiled(first, x), compiled(second, x)
    assert all(kept.key is key for kept, key in zip(derived.kept.values(), keys))  # neither recomputed
    del first
    with torch.no_grad():
        compiled(ScaledLinear(), x)  # a third set: the first one's, gone, is dropped
    assert len(derived.kept) == 2


def test_a_training_graph_keeps_nothing(compiled_graphs):
    torch.manual_seed(0)
    model = ScaledLinear()
    compiled = kiln.compile(model)
    x = torch.randn(4, 16)
    compiled(x).sum().backward()
    assert compiled_graphs and all(not g.kept for g in compiled_graphs)


def test_results_of_tensors_that_are_not_parameters_are_not_kept():
    calls = []

    def compute(a):
        calls.append(a)
        return (a * 2,)

    derived = ParameterDerived(compute, (0,))
    a = torch.randn(3)
    derived(a)
    derived(a)
    assert len(calls) == 2 and not derived.kept
    p = nn.Parameter(torch.randn(3))
    derived(p)
    derived(p)
    assert len(calls) == 3


def test_an_input_only_kernel_over_inference_tensors_is_computed_every_call():
    # m * 2 reads a graph input alone (a matmul reads its result), but not a parameter: inference_mode
    # tensors have no version counter, and a new m comes with every call
    compiled = kiln.compile(lambda x, m: x @ (m * 2.0))
    with torch.inference_mode():
        for _ in range(3):
            x, m = torch.randn(4, 16), torch.randn(16, 8)
            torch.testing.assert_close(compiled(x, m), x @ (m * 2.0))


def test_a_kernel_that_writes_nothing_is_not_kept():
    """A computation over inputs alone whose every value is overwritten before it is read (the part of `t` the
    fill covers) leaves a kernel that stores nothing: there is nothing to keep, and the graph still compiles."""
    def fill_after_select(a):
        t = torch.where(a > a, a, a)
        t[..., 1:].fill_(2)
        return t

    a = torch.randn(4, 3)
    torch.testing.assert_close(kiln.compile(fill_after_select)(a), fill_after_select(a))
