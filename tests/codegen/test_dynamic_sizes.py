"""Symbolic sizes reach the generated code only where `call` binds them (issue 21, class 1).

An inference graph keeps the results of kernels that read graph inputs alone across calls (computed in a
function outside `call`); with a symbolic batch or sequence length such a kernel used to read the size
symbol where it is not bound (`NameError: name 's26' is not defined`) on every call after the first
size change. Each case compares kiln with eager over several sizes and checks that no graph fell back
to ATen, so the kernels themselves ran.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import kiln
from kiln.pipeline import unbound_globals
from support.triton_device import DEVICE, skip_unless_kernels_run


def assert_compiled(compiled_graphs) -> None:
    """Every graph kiln built ran through its own kernels (none fell back to ATen)."""
    assert compiled_graphs
    for g in compiled_graphs:
        assert "fallback" not in g.artefacts, g.artefacts["fallback"]


def relu_matmul(x, y):
    return torch.relu(x) @ y


@pytest.mark.parametrize("dynamic", [None, True])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_relu_matmul_over_batch_sizes(compiled_graphs, dynamic, grad):
    kiln.reset()
    compiled = kiln.compile(relu_matmul, dynamic=dynamic)
    y = torch.randn(8, 8)
    for batch in (4, 6, 9, 4):
        x = torch.randn(batch, 8)
        with torch.set_grad_enabled(grad):
            xs = [x.clone().requires_grad_(grad) for _ in range(2)]
            got, ref = compiled(xs[0], y), relu_matmul(xs[1], y)
            torch.testing.assert_close(got, ref)
            if grad:
                got.sum().backward()
                ref.sum().backward()
                torch.testing.assert_close(xs[0].grad, xs[1].grad)
    assert_compiled(compiled_graphs)


def embedding_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(100, 16), nn.LayerNorm(16), nn.Linear(16, 16)).eval()


@pytest.mark.parametrize("dynamic", [None, True])
def test_embedding_layernorm_linear_over_sequence_lengths(compiled_graphs, dynamic):
    kiln.reset()
    model = embedding_model()
    compiled = kiln.compile(model, dynamic=dynamic)
    with torch.no_grad():
        for length in (8, 12, 16, 5):
            ids = torch.randint(0, 100, (2, length))
            torch.testing.assert_close(compiled(ids), model(ids), atol=1e-5, rtol=1e-5)
    assert_compiled(compiled_graphs)


class ScaledLinear(nn.Module):
    """`weight * sigmoid(scale)` reads parameters alone (static sizes): kept across calls even when the batch
    is symbolic."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 16))
        self.scale = nn.Parameter(torch.randn(8, 1))

    def forward(self, x):
        return torch.relu(x) @ (self.weight * self.scale.sigmoid()).t()


def test_parameter_kernels_are_kept_with_a_symbolic_batch(compiled_graphs):
    kiln.reset()
    torch.manual_seed(0)
    model = ScaledLinear()
    compiled = kiln.compile(model, dynamic=True)
    with torch.no_grad():
        for batch in (3, 7, 2):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x))
    assert_compiled(compiled_graphs)
    wrapper = compiled_graphs[-1].artefacts["wrapper.py"]
    kept_function = wrapper.split("def call(")[0]
    assert "ParameterDerived(" in kept_function  # the weight transform is still computed once per version
    assert "size(" not in kept_function and "s" not in {w[0] for w in kept_function.split() if w[1:].isdigit()}


@pytest.mark.parametrize("dynamic", [None, True])
def test_triton_relu_matmul_over_batch_sizes(compiled_graphs, dynamic):
    skip_unless_kernels_run()
    kiln.reset()
    compiled = kiln.compile(relu_matmul, dynamic=dynamic, options={"cpu_backend": "triton"})
    y = torch.randn(8, 8, device=DEVICE)
    with torch.no_grad():
        for batch in (4, 6, 9):
            x = torch.randn(batch, 8, device=DEVICE)
            torch.testing.assert_close(compiled(x, y), relu_matmul(x, y))
    assert_compiled(compiled_graphs)


def test_unbound_globals_names_what_a_function_reads_but_nothing_binds():
    source = "def _compute(arg0):\n    return arg0.view(s26, 8)\n\ndef call(arg0):\n    s26 = arg0.size(0)\n" \
             "    return _compute(arg0), len(arg0), torch\n"
    code = compile(source, "<test>", "exec")
    namespace = {"torch": torch}
    exec(code, namespace)  # defines _compute and call, as the wrapper's module does
    assert unbound_globals(code, namespace) == ["s26 (in _compute)"]
    assert unbound_globals(code, {**namespace, "s26": 1}) == []


@pytest.mark.allows_fallback('graph: the wrapper is broken on purpose')
def test_a_wrapper_reading_an_unbound_name_falls_back_at_compile_time(compiled_graphs, monkeypatch):
    """The check runs when the graph is compiled: the graph runs through ATen (correct values) instead of
    raising NameError on each call."""
    from kiln.codegen import wrapper

    original = wrapper.WrapperCodegen.generate
    monkeypatch.setattr(wrapper.WrapperCodegen, "generate",
                        lambda self: original(self).replace("return (", "return (s999 + 0, ", 1))
    kiln.reset()
    compiled = kiln.compile(lambda x: x.sin() + 1)
    x = torch.randn(5)
    for _ in range(2):
        torch.testing.assert_close(compiled(x), x.sin() + 1)
    assert "s999" in compiled_graphs[-1].artefacts["fallback"]
