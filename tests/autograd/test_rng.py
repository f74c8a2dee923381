"""Random ops in compiled graphs: eager's distribution, eager's exact stream, the generator moved as eager moves it."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from support.autograd import compile_module


class Drop(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p
        self.lin = nn.Linear(64, 64)

    def forward(self, x):
        return F.dropout(self.lin(x), p=self.p, training=True)


def test_dropout_distribution_and_backward_uses_the_forward_mask():
    p = 0.3
    model = Drop(p)
    x = torch.randn(256, 64)
    compiled = compile_module(model, [x])
    out = compiled(x)
    kept = out != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01  # 16384 draws: 4.6 sigma
    reference = model.lin(x).detach()
    torch.testing.assert_close(out[kept], reference[kept] / (1 - p))
    grad = torch.randn_like(out)
    out.backward(grad)
    # d out / d bias = mask / (1 - p): the backward must see the same mask as the forward.
    torch.testing.assert_close(model.lin.bias.grad, (grad * kept / (1 - p)).sum(0))


def test_dropout_stream_matches_eager_exactly_under_aot_eager():
    """Documented behaviour: the ATen graphs draw from the global generator in eager's order."""
    model = Drop(0.5)
    x = torch.randn(32, 64)
    compiled = compile_module(model, [x])
    torch.manual_seed(123)
    eager_out = model(x)
    torch.manual_seed(123)
    compiled_out = compiled(x)
    assert torch.equal(eager_out, compiled_out)
    torch.manual_seed(7)
    with torch.no_grad():
        eager_inference = model(x)
        torch.manual_seed(7)
        assert torch.equal(compiled(x), eager_inference)


# Every kind of draw, as a user writes it: each moves the global generator, whether or not its value is used.
DRAWS = {
    "rand": lambda a: torch.rand(5),
    "randn": lambda a: torch.randn(2, 3),
    "randint": lambda a: torch.randint(0, 10, (4,)),
    "rand_like": lambda a: torch.rand_like(a),
    "randn_like": lambda a: torch.randn_like(a),
    "normal": lambda a: torch.normal(a.detach(), 1.0),
    "bernoulli": lambda a: torch.bernoulli(torch.full_like(a, 0.5)),
    "dropout": lambda a: F.dropout(a, 0.5, training=True),
    "uniform_": lambda a: torch.empty(6).uniform_(),
    "exponential_": lambda a: torch.empty(6).exponential_(),
    "random_": lambda a: torch.empty(6).random_(100),
    "random_ from": lambda a: torch.empty(2, 6).t().random_(-3, 100),  # `random_.from`: a strided draw
    "multinomial": lambda a: torch.multinomial(torch.ones(6), 3),
    "randperm": lambda a: torch.randperm(7),
}


def _unused_then_used(draw):
    def f(a):
        draw(a)  # unused: still moves the generator
        r = draw(a)
        return a.exp() * 2, r
    return f


def _same_draws(fn, compiled, a, seed):
    """Call eager and compiled after the same seed: their draws, the generator's state after the call, and the
    next draw after it must all be equal."""
    torch.manual_seed(seed)
    expected = fn(a)
    state, after = torch.get_rng_state(), torch.rand(3)
    torch.manual_seed(seed)
    actual = compiled(a)
    assert torch.equal(torch.get_rng_state(), state), "the generator moved differently from eager"
    assert torch.equal(torch.rand(3), after)
    assert torch.equal(actual[1], expected[1]), "draws differ from eager's"
    torch.testing.assert_close(actual[0], expected[0])
    return expected, actual


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", list(DRAWS))
def test_every_draw_moves_the_generator_as_in_eager(name, backend):
    """Training and inference graphs of one function: an unused draw is neither dropped (the partition once kept
    only what the forward's outputs read) nor drawn twice, and a used one gives eager's values."""
    fn = _unused_then_used(DRAWS[name])
    compiled = kiln.compile(fn, backend=backend)
    for seed, requires_grad in ((0, True), (1, False), (2, True)):
        a = torch.randn(3, requires_grad=requires_grad)
        expected, actual = _same_draws(fn, compiled, a, seed)
        if requires_grad:
            state = torch.get_rng_state()
            actual[0].sum().backward()  # the backward draws nothing: the generator stays where it is
            assert torch.equal(torch.get_rng_state(), state)
            torch.testing.assert_close(a.grad, 2 * a.detach().exp())


class _DrawsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        torch.rand(4)  # unused: the backward moves the generator, once
        return grad * 2


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_an_unused_draw_in_a_backward_runs_in_the_backward(backend):
    fn = _DrawsInBackward.apply
    compiled = kiln.compile(fn, backend=backend)
    states = []
    for f in (fn, compiled):
        a = torch.randn(3, requires_grad=True)
        out = f(a)
        torch.manual_seed(5)
        out.sum().backward()
        states.append(torch.get_rng_state())
        torch.testing.assert_close(a.grad, torch.full((3,), 2.0))
    assert torch.equal(*states)
