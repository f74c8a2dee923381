"""What a whole step compiled under compiled autograd spares: the forward's own backward graph is not built
(the captured backward inlines its ATen ops; it is built on first use where the engine does run it), and
those ops are inlined as a copy of the graph's nodes rather than traced again op by op. The gradients are
eager's either way."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from compiled_autograd.test_training_steps import Block, ConvBN
from kiln import compiled_autograd
from kiln.compiled_autograd import tracer
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
    "mlp": (lambda: torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)),
            lambda: torch.randn(4, 6)),
    "norm": (lambda: torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.LayerNorm(6), torch.nn.GELU()),
             lambda: torch.randn(4, 6)),
    "attention_block": (Block, Block.batch),
    "conv_bn": (ConvBN, ConvBN.batch),
}


def model_and_grads(name):
    torch.manual_seed(0)
    make_model, make_batch = MODELS[name]
    model, x = make_model(), make_batch()
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


@pytest.fixture
def inlined(monkeypatch):
    """Per backward graph compiled autograd inlined, whether it was copied node by node."""
    seen = []
    original = tracer._inlinable

    def spy(*args):
        seen.append(original(*args))
        return seen[-1]

    monkeypatch.setattr(tracer, "_inlinable", spy)
    return seen


@pytest.mark.parametrize("name", list(MODELS))
def test_the_forwards_backward_is_copied_into_the_captured_graph(name, inlined):
    model, x, expected = model_and_grads(name)
    kiln.config.compiled_autograd = True
    kiln.compile(train)(model, x)
    torch.testing.assert_close([p.grad for p in model.parameters()], expected)
    assert inlined == [True]


def test_a_graph_given_other_strides_than_it_recorded_is_not_copied():
    """The recorded metadata describes the outputs only for the inputs the graph was traced with."""
    gm = make_fx(lambda a, b: [a.t() @ b, a.sum(0)], tracing_mode="fake")(torch.randn(3, 4), torch.randn(3, 2))
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    outputs = gm.graph.output_node().args[0]
    assert tracer._inlinable(gm, placeholders, [torch.randn(3, 4), torch.randn(3, 2)], outputs)
    transposed = torch.randn(4, 3).t()
    assert not tracer._inlinable(gm, placeholders, [transposed, torch.randn(3, 2)], outputs)
    assert not tracer._inlinable(gm, placeholders, [torch.randn(3, 4), torch.randn(3, 2, dtype=torch.float64)],
                                 outputs)


def test_a_graph_calling_a_python_function_is_not_copied():
    """Only ATen calls are copied: a Python function in the graph runs as the interpreter runs it."""
    gm = torch.fx.symbolic_trace(lambda a: [torch.nn.functional.relu(a) * 2])
    placeholder = next(iter(gm.graph.find_nodes(op="placeholder")))
    placeholder.meta["val"] = torch.randn(3)
    for node in gm.graph.nodes:
        node.meta.setdefault("val", torch.randn(3))
    outputs = gm.graph.output_node().args[0]
    assert not tracer._inlinable(gm, [placeholder], [torch.randn(3)], outputs)


def test_a_size_one_dimension_may_have_another_stride():
    """`unsqueeze` gives a size-1 dimension stride 1 where an expand gives 0: the same layout."""
    gm = make_fx(lambda a, t: [a * 2, t + 1], tracing_mode="fake")(torch.randn(3, 4), torch.zeros(2, 1))
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    outputs = gm.graph.output_node().args[0]
    expanded = torch.zeros(2).unsqueeze(1).expand(2, 1)
    assert tracer._inlinable(gm, placeholders, [torch.randn(3, 4), torch.zeros(2, 1).as_strided((2, 1), (1, 0))],
                             outputs)
    assert not tracer._inlinable(gm, placeholders, [torch.randn(3, 4)[:, ::1].t().contiguous().t(), expanded],
                                 outputs)


def test_a_classifier_step_with_cross_entropy_is_copied(inlined):
    """nll_loss's backward reads the targets as saved (2, 1) indices, whose size-1 stride the compiled
    forward gives otherwise than its trace recorded."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 5))
    x, y = torch.randn(4, 6), torch.tensor([0, 3, 1, 4])
    torch.nn.functional.cross_entropy(model(x), y).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    kiln.config.compiled_autograd = True
    kiln.compile(step)()
    torch.testing.assert_close([p.grad for p in model.parameters()], expected)
    assert inlined == [True]
