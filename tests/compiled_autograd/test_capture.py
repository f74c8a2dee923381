"""Compiled autograd captures the backward the engine runs: one graph per structure, hooks included, and the
gradients eager computes. Seed 003's examples first, then each kind of hook, then the cache."""
import logging

import pytest
import torch

import kiln
from kiln import compiled_autograd
from support.autograd import Cube


def inductor(gm):
    return kiln.compile(gm, fullgraph=True)


def eager_graph(gm):
    return gm


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(10, 10)

    def forward(self, x):
        return self.linear(x)


def train(model, x):
    loss = model(x).sum()
    loss.backward()


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_train_gives_one_backward_graph_and_eager_gradients():
    torch.manual_seed(0)
    model, x = Model(), torch.randn(10)
    train(model, x)
    expected = grads(model)
    model.zero_grad()
    with compiled_autograd.enable(inductor):
        train(model, x)
    assert len(compiled_autograd.captured_graphs()) == 1
    torch.testing.assert_close(grads(model), expected)


def test_graph_is_reused_while_the_structure_stays():
    torch.manual_seed(0)
    model = Model()
    with compiled_autograd.enable(inductor):
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            train(model, torch.randn(10))
    assert len(compiled_autograd.captured_graphs()) == 1


def test_accumulating_into_existing_grads_matches_eager():
    torch.manual_seed(0)
    model, x = Model(), torch.randn(10)
    for _ in range(3):
        train(model, x)
    expected = grads(model)
    model.zero_grad(set_to_none=True)
    with compiled_autograd.enable(inductor):
        for _ in range(3):
            train(model, x)
    torch.testing.assert_close(grads(model), expected)
    # the first backward creates .grad, the next ones add into it: two structures
    assert len(compiled_autograd.captured_graphs()) == 2


def test_forward_with_two_graph_breaks_gets_one_backward_graph():
    @kiln.compile(backend="aot_eager")
    def fn(x):
        temp = x + 10
        kiln.graph_break()
        temp = temp + 10
        kiln.graph_break()
        return temp.sum()

    x = torch.randn(10, 10, requires_grad=True)
    loss = fn(x)
    # the three forward graphs' backwards are traced into the one captured graph, as ATen ops
    with compiled_autograd.enable(inductor):
        loss.backward()
    (graph,) = compiled_autograd.captured_graphs()
    assert not [n for n in graph.graph.nodes if n.target is compiled_autograd.ops.call_backward]
    torch.testing.assert_close(x.grad, torch.ones(10, 10))


def test_compiled_train_with_backward_inside_is_one_graph_under_fullgraph():
    torch.manual_seed(0)
    model, x = Model(), torch.randn(10)
    train(model, x)
    expected = grads(model)
    model.zero_grad()
    kiln.config.compiled_autograd = True
    explained = kiln.explain(train)(model, x)
    assert explained.graph_break_count == 0
    assert [b.reason for b in explained.boundaries] == ["compiled_autograd"]
    model.zero_grad()
    kiln.compile(train, fullgraph=True)(model, x)
    torch.testing.assert_close(grads(model), expected)


def test_backward_inside_a_compiled_function_is_a_break_without_compiled_autograd():
    with pytest.raises(kiln.FullGraphError, match="autograd_backward"):
        kiln.compile(train, fullgraph=True)(Model(), torch.randn(10))


@pytest.mark.parametrize("use_autograd_grad", [False, True])
def test_tensor_hook_is_a_call_node_and_runs_as_in_eager(use_autograd_grad):
    def run():
        torch.manual_seed(0)
        x = torch.randn(10, 10, requires_grad=True)
        seen = []
        x.register_hook(lambda grad: seen.append(grad.shape) or grad * 2 + 10)
        loss = (x * x).sum()
        grad = torch.autograd.grad(loss, x)[0] if use_autograd_grad else (loss.backward(), x.grad)[1]
        return grad, seen

    expected, expected_seen = run()
    with compiled_autograd.enable(eager_graph):
        got, seen = run()
    torch.testing.assert_close(got, expected)
    assert seen == expected_seen
    (graph,) = compiled_autograd.captured_graphs()
    hooks = [n for n in graph.graph.nodes if n.target is compiled_autograd.ops.call_hook]
    assert [n.kwargs["hook_type"] for n in hooks] == ["tensor_pre_hook"]


def hooked_model(log):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model[2].register_full_backward_hook(lambda mod, grad_in, grad_out: (grad_in[0] * 2,))
    model[0].register_full_backward_pre_hook(lambda mod, grad_out: log.append("pre") or (grad_out[0] + 1,))
    model[0].weight.register_post_accumulate_grad_hook(lambda p: log.append(float(p.grad.sum())))
    return model


@pytest.mark.parametrize("compiler", [eager_graph, inductor], ids=["graph", "kiln"])
def test_module_hooks_and_post_accumulate_hooks_behave_as_eager(compiler):
    x = torch.randn(3, 4, requires_grad=True)
    expected_log, got_log = [], []
    eager_model = hooked_model(expected_log)
    for _ in range(2):
        eager_model(x).sum().backward()
    model = hooked_model(got_log)
    with compiled_autograd.enable(compiler):
        for _ in range(2):
            model(x.detach().requires_grad_()).sum().backward()
    torch.testing.assert_close(grads(model), grads(eager_model))
    assert got_log == pytest.approx(expected_log)
    # torch runs a module's backward hooks (pre-hooks too) as post-hooks of its BackwardHookFunction nodes
    kinds = [n.kwargs.get("hook_type") for n in compiled_autograd.captured_graphs()[0].graph.nodes
             if n.target is compiled_autograd.ops.call_hook]
    assert kinds == ["post_hook"] * 4


def test_retain_grad_stores_the_grad_of_a_non_leaf():
    def run():
        x = torch.arange(3.0, requires_grad=True)
        y = x * 2
        y.retain_grad()
        (y * y).sum().backward()
        return x.grad, y.grad

    expected = run()
    with compiled_autograd.enable(inductor):
        got = run()
    torch.testing.assert_close(got, expected)


def test_kiln_forward_graph_backward_is_traced_into_the_captured_graph():
    torch.manual_seed(0)
    model, x = Model(), torch.randn(4, 10)
    compiled = kiln.compile(model)
    compiled(x).relu().sum().backward()
    expected = grads(model)
    model.zero_grad()
    with compiled_autograd.enable(inductor):
        compiled(x).relu().sum().backward()
    torch.testing.assert_close(grads(model), expected)
    (graph,) = compiled_autograd.captured_graphs()
    assert not [n for n in graph.graph.nodes if n.target is compiled_autograd.ops.call_backward]


def test_python_autograd_function_backward_runs_in_the_graph():
    x = torch.randn(5, requires_grad=True)
    Cube.apply(x).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    with compiled_autograd.enable(inductor):
        Cube.apply(x).sum().backward()
    torch.testing.assert_close(x.grad, expected)


def test_size_change_recaptures_once_then_sizes_are_symbolic(caplog):
    caplog.set_level(logging.INFO, logger="kiln.compiled_autograd")
    with compiled_autograd.enable(inductor):
        for n in [10, 100, 10, 50]:
            x = torch.randn(n, n, requires_grad=True)
            x.sum().backward()
            torch.testing.assert_close(x.grad, torch.ones(n, n))
    assert len(compiled_autograd.captured_graphs()) == 2
    assert any("changed tensor shapes" in r.getMessage() for r in caplog.records)


def test_a_new_autograd_structure_recaptures_and_logs_why(caplog):
    caplog.set_level(logging.INFO, logger="kiln.compiled_autograd")
    x = torch.randn(10, requires_grad=True)
    with compiled_autograd.enable(inductor):
        for op in [torch.add, torch.sub, torch.mul, torch.div]:
            x.grad = None
            op(x, x).sum().backward()
            expected = torch.func.grad(lambda t, op=op: op(t, t).sum())(x.detach())
            torch.testing.assert_close(x.grad, expected)
    assert len(compiled_autograd.captured_graphs()) == 4
    assert any("new autograd node" in r.getMessage() for r in caplog.records)


def test_graph_is_logged_under_its_topic(caplog):
    caplog.set_level(logging.INFO, logger="kiln.compiled_autograd")
    with compiled_autograd.enable(eager_graph):
        train(Model(), torch.randn(10))
    assert any("compiled autograd graph" in r.getMessage() and "aten.mm" in r.getMessage() for r in caplog.records)


def test_disable_runs_the_engine_eagerly_inside_enable():
    with compiled_autograd.enable(inductor), compiled_autograd.disable():
        train(Model(), torch.randn(10))
    assert compiled_autograd.captured_graphs() == []


def test_in_place_ops_on_views_backward_through_copy_slices():
    def run():
        x = torch.arange(6.0, requires_grad=True)
        y = x * 1
        y[1:3].mul_(torch.tensor(3.0))
        y.view(2, 3).t().sin_()
        (y * y).sum().backward()
        return x.grad

    expected = run()
    with compiled_autograd.enable(inductor):
        torch.testing.assert_close(run(), expected)


def test_writing_a_saved_input_between_forward_and_backward_raises_as_eager():
    """The backward inlined into the captured graph keeps the version check its own backward makes."""
    def run(model):
        x = torch.randn(3, 10, requires_grad=True)
        y = x * 1
        out = model(y).sum()
        y.add_(1)  # eager's linear saved its input: backward must refuse
        out.backward()

    model = Model()
    with pytest.raises(RuntimeError) as eager_error:
        run(model)
    with compiled_autograd.enable(inductor), pytest.raises(type(eager_error.value), match="modified by an inplace"):
        run(kiln.compile(model))
