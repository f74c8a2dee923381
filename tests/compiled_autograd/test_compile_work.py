"""What a forward compiled under compiled autograd does not build: its own backward graph, whose ATen ops the
captured backward inlines. It is built on first use where the engine does run it, and the gradients are
eager's either way."""
import pytest
import torch

import kiln
from kiln import compiled_autograd
from kiln.pipeline import ATEN_COMPILER_HOOKS


@pytest.fixture
def compiled_kinds():
    """The kind of each ATen graph kiln's code generator compiles during the test, in order."""
    kinds = []

    def hook(compile_graph):
        def recording(gm, example_inputs, options=None):
            kinds.append(gm.meta.get("kiln.aot", {}).get("kind", "graph"))
            return compile_graph(gm, example_inputs, options)
        return recording

    ATEN_COMPILER_HOOKS.append(hook)
    yield kinds
    ATEN_COMPILER_HOOKS.remove(hook)


MODELS = {
    "mlp": lambda: torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)),
    "norm": lambda: torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.LayerNorm(6), torch.nn.GELU()),
}


def model_and_grads(name):
    torch.manual_seed(0)
    model, x = MODELS[name](), torch.randn(4, 6)
    model(x).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return model, x, expected


def train(model, x):
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("name", list(MODELS))
def test_a_step_under_compiled_autograd_builds_no_separate_backward(name, compiled_kinds):
    model, x, expected = model_and_grads(name)
    kiln.config.compiled_autograd = True
    kiln.compile(train)(model, x)
    torch.testing.assert_close([p.grad for p in model.parameters()], expected)
    assert "forward" in compiled_kinds
    assert "backward" not in compiled_kinds  # the captured backward is an inference graph of its own
    assert len(compiled_autograd.captured_graphs()) == 1


@pytest.mark.parametrize("name", list(MODELS))
def test_the_forwards_backward_is_built_when_the_engine_runs_it(name, compiled_kinds):
    """A forward compiled under compiled autograd whose backward then runs on the eager engine."""
    model, x, expected = model_and_grads(name)
    kiln.config.compiled_autograd = True
    out = kiln.compile(model)(x)
    assert "backward" not in compiled_kinds
    with compiled_autograd.disable():
        out.square().mean().backward()
    assert compiled_kinds.count("backward") == 1
    torch.testing.assert_close([p.grad for p in model.parameters()], expected)


def test_without_compiled_autograd_the_backward_is_built_with_the_forward(compiled_kinds):
    model, x, expected = model_and_grads("mlp")
    out = kiln.compile(model)(x)
    assert compiled_kinds == ["forward", "backward"]
    out.square().mean().backward()
    torch.testing.assert_close([p.grad for p in model.parameters()], expected)
