"""options={"fallback_random": True}: random ops draw eager's stream, bit for bit, under every backend.

kiln generates no random numbers itself: each random op runs as the ATen call eager makes, in graph order.
What could change the stream is a decomposition that draws its randomness another way (bernoulli(p) as
rand_like(p) < p); under fallback_random none is applied. The programs mix random ops with pointwise math that
fuses around them, so a reordering of the draws would show.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.lower.decompositions import decomposition_table, is_random
from support import triton_device  # sets TRITON_INTERPRET before kiln loads a Triton kernel


def random_ops(x):
    """Each draw with one exact op around it (a product by 2, a sum with x): equal results mean equal draws, where
    longer math could differ in its last bit between a fused kernel and eager's."""
    p = x.detach().abs().clamp(max=1)
    return (F.dropout(x, 0.5, training=True) * 2, torch.rand_like(x) + x, torch.randn(x.shape) * x,
            torch.bernoulli(p), x.new_empty(x.shape).uniform_(-1, 1) + x, x.new_empty(x.shape).normal_() * 2,
            torch.randint(0, 10, x.shape), F.rrelu(x, training=True), torch.randperm(7),
            torch.multinomial(p.flatten() + 0.1, 3))


def dropout_mlp(x):
    h = F.dropout(torch.relu(x * 2 - 1), 0.3, training=True)
    return F.dropout(h * 3, 0.5, training=True)


PROGRAMS = [random_ops, dropout_mlp]
TRITON_ON_CPU = pytest.mark.skipif(triton_device.DEVICE != "cpu" or not triton_device.INTERPRETING,
                                   reason="Triton kernels over CPU tensors need TRITON_INTERPRET=1")
BACKENDS = [("eager", None), ("aot_eager", None), ("inductor", {"fallback_random": True}),
            pytest.param("inductor", {"fallback_random": True, "cpu_backend": "triton"}, marks=TRITON_ON_CPU)]


def _eager_and_compiled(fn, backend, options, requires_grad):
    x = torch.randn(6, 6, requires_grad=requires_grad)
    torch.manual_seed(1234)
    expected = fn(x)
    compiled = kiln.compile(fn, backend=backend, options=options)
    torch.manual_seed(1234)
    actual = compiled(x)
    return expected, actual, x


@pytest.mark.sampled(every=4, classes=("requires_grad", "fn"))
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("backend, options", BACKENDS, ids=lambda v: str(v))
@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "training"])
def test_same_seed_same_stream(fn, backend, options, requires_grad):
    expected, actual, _ = _eager_and_compiled(fn, backend, options, requires_grad)
    for e, a in zip(torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(actual)):
        assert torch.equal(e, a), (e - a).abs().max()


def test_training_gradients_use_the_forward_masks():
    expected, actual, x = _eager_and_compiled(dropout_mlp, "inductor", {"fallback_random": True}, True)
    (grad_expected,) = torch.autograd.grad(expected.sum(), x)
    (grad_actual,) = torch.autograd.grad(actual.sum(), x)
    torch.testing.assert_close(grad_actual, grad_expected)


def test_the_stream_continues_as_eager_after_the_graph():
    compiled = kiln.compile(random_ops, options={"fallback_random": True})
    x = torch.randn(6, 6)
    torch.manual_seed(7)
    random_ops(x)
    after_eager = torch.rand(3)
    torch.manual_seed(7)
    compiled(x)
    assert torch.equal(torch.rand(3), after_eager)  # the graph drew exactly as many numbers as eager


def test_no_random_op_is_decomposed(compiled_graphs):
    compiled = kiln.compile(lambda p: torch.bernoulli(p) * 2, options={"fallback_random": True})
    p = torch.rand(8)
    torch.manual_seed(0)
    expected = torch.bernoulli(p) * 2
    torch.manual_seed(0)
    assert torch.equal(compiled(p), expected)
    assert "aten.bernoulli.default" in compiled_graphs[-1].artefacts["aten_graph"]
    assert not any(is_random(op) for op in decomposition_table(fallback_random=True))
    assert any(is_random(op) for op in decomposition_table())  # what the option changes
