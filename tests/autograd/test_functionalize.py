"""Functionalization: pure graphs, input mutations lifted to outputs and replayed on the real inputs."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.autograd import aot_eager
from kiln.autograd.functionalize import functionalize, verify_functional
from kiln.autograd.signature import TensorSpec

aten = torch.ops.aten


def mutating(x, y):
    x.add_(1)
    v = y.view(-1)
    v.mul_(2)  # mutates y through a view
    z = (x + y).relu_()
    return z * 3


def specs(*tensors):
    return [TensorSpec.of(t) for t in tensors]


def test_inplace_ops_removed_and_input_mutations_become_outputs():
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    traced = make_fx(mutating)(x.clone(), y.clone())
    graph, mutations = functionalize(traced, specs(x, y))
    verify_functional(graph)
    assert sorted(m.input_index for m in mutations) == [0, 1]
    assert not any(n.target in (aten.copy_.default, aten.add_.Tensor, aten.relu_.default) for n in graph.graph.nodes)
    outs = graph(x, y)
    ex, ey = x.clone(), y.clone()
    expected = mutating(ex, ey)
    torch.testing.assert_close(outs[0], expected)
    new = {m.input_index: outs[m.output_index] for m in mutations}
    torch.testing.assert_close(new[0], ex)
    torch.testing.assert_close(new[1], ey)
    torch.testing.assert_close(x, ex - 1)  # the functional graph itself left its inputs alone


def test_compiled_call_applies_mutations_to_the_real_inputs():
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    compiled = aot_eager(torch.fx.symbolic_trace(mutating), [x.clone(), y.clone()])
    ex, ey = x.clone(), y.clone()
    expected = mutating(ex, ey)
    torch.testing.assert_close(compiled(x, y), expected)
    torch.testing.assert_close(x, ex)
    torch.testing.assert_close(y, ey)


def test_batchnorm_eval_mode_leaves_running_stats_and_train_mode_updates_them():
    bn = torch.nn.BatchNorm1d(3)
    x = torch.randn(4, 3)
    compiled = aot_eager(torch.fx.symbolic_trace(torch.nn.Sequential(bn)), [x])
    with torch.no_grad():
        compiled(x)
    assert bn.num_batches_tracked.item() == 1
    torch.testing.assert_close(bn.running_mean, 0.1 * x.mean(0))
    bn.eval()
    compiled_eval = aot_eager(torch.fx.symbolic_trace(torch.nn.Sequential(bn)), [x])
    before = bn.running_mean.clone()
    compiled_eval(x)
    assert torch.equal(bn.running_mean, before) and bn.num_batches_tracked.item() == 1


def test_mutating_an_input_that_requires_grad_is_refused_clearly():
    def f(x, w):
        h = x * w
        h.add_(1)
        w2 = w * 1
        return h, w2

    w = torch.randn(3, requires_grad=True)
    aot_eager(torch.fx.symbolic_trace(f), [torch.randn(3), w])  # mutating an intermediate is fine

    class Leafy(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            x.mul_(2)
            return y

    x = torch.randn(3).requires_grad_()
    with pytest.raises((NotImplementedError, RuntimeError), match="in-place|requires grad"):
        aot_eager(torch.fx.symbolic_trace(Leafy()), [x * 1])


def test_verify_functional_rejects_mutable_ops():
    graph = make_fx(lambda x: x.add_(1))(torch.randn(2))
    with pytest.raises(NotImplementedError, match="mutates"):
        verify_functional(graph)
