"""Random ops in compiled graphs: eager's distribution, eager's exact stream, the generator moved as eager moves it."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.autograd import aot_cache
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


@pytest.mark.sampled(every=2, classes=("name",))
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


# In-place draws into tensors laid out otherwise than row-major, as a user's program meets them: dropout on a
# transposed activation (`empty_like` keeps its strides), a draw into a strided slice of a buffer.
LAYOUTS = {
    "transposed": lambda a: torch.empty_like(a.detach()).permute(2, 0, 1),
    "every other column": lambda a: a.detach().new_zeros(4, 6, 10)[:, :, ::2],
    "transposed with gaps": lambda a: a.detach().new_zeros(10, 6, 4).permute(2, 1, 0)[:, :, ::2],
}
IN_PLACE_DRAWS = {
    "bernoulli_ p": lambda t: t.bernoulli_(0.3),
    "bernoulli_ tensor": lambda t: t.bernoulli_(torch.full_like(t, 0.3)),
    "normal_": lambda t: t.normal_(),
    "uniform_": lambda t: t.uniform_(-1, 1),
    "exponential_": lambda t: t.exponential_(),
    "geometric_": lambda t: t.geometric_(0.3),
    "cauchy_": lambda t: t.cauchy_(),
    "log_normal_": lambda t: t.log_normal_(),
    "random_": lambda t: t.random_(),
    "random_ to": lambda t: t.random_(100),
    "random_ from": lambda t: t.random_(-3, 100),
}


@pytest.mark.sampled(every=2, classes=("name", "layout"))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(IN_PLACE_DRAWS))
def test_an_in_place_draw_puts_eager_numbers_where_eager_puts_them(name, layout, backend):
    """Functionalization's variant of an in-place draw allocates its own result (`bernoulli.p` row-major,
    `normal_functional` a dense clone): drawn there, the numbers land elsewhere than eager's kernel puts them
    in the tensor's own layout."""
    draw, make = IN_PLACE_DRAWS[name], LAYOUTS[layout]

    def f(a):
        return a * 2, draw(make(a))

    _same_draws(f, kiln.compile(f, backend=backend), torch.randn(4, 6, 5), seed=3)


LIKE_DRAWS = {
    "rand_like": torch.rand_like,
    "randn_like": torch.randn_like,
    "randint_like": lambda t: torch.randint_like(t, 10),
    "randint_like low": lambda t: torch.randint_like(t, -4, 10),
}
VALUE_LAYOUTS = {
    "transposed": lambda a: (a * 1).permute(2, 0, 1),
    "transposed with gaps": lambda a: (a * 1).permute(2, 1, 0)[:, :, ::2],
}


@pytest.mark.sampled(every=2, classes=("name", "layout"))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("layout", list(VALUE_LAYOUTS))
@pytest.mark.parametrize("name", list(LIKE_DRAWS))
def test_a_draw_like_a_strided_value_puts_eager_numbers_where_eager_puts_them(name, layout, backend):
    """`rand_like(x)` draws into `empty_like(x)`: a code generator running it on x in a layout of its own (a
    strided slice stored row-major) must not move the numbers."""
    draw, make = LIKE_DRAWS[name], VALUE_LAYOUTS[layout]

    def f(a):
        return a * 2, draw(make(a))

    _same_draws(f, kiln.compile(f, backend=backend), torch.randn(4, 6, 10), seed=4)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_dropout_on_a_transposed_input_keeps_eager_mask(backend):
    """Dropout draws its mask into `empty_like(input)`: with the input's strides, not row-major ones."""
    def f(a):
        return a.exp(), F.dropout(a, 0.5, training=True)

    compiled = kiln.compile(f, backend=backend)
    for requires_grad in (False, True):
        a = torch.randn(2, 4, 7).permute(2, 0, 1).requires_grad_(requires_grad)
        expected, actual = _same_draws(f, compiled, a, seed=11)
        if requires_grad:
            actual[1].sum().backward()
            torch.testing.assert_close(a.grad, (expected[1] != 0).float() * 2)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_dropout_on_a_transposed_value_stored_for_other_uses_keeps_eager_mask(backend):
    """A transposed value that other results read too is stored once, in kiln's order: dropout's mask must
    still be drawn in eager's order (fuzz seed 442727: gelu of a transposed input, returned and dropped out while
    training beside an input of symbolic sizes, got row-major numbers from the dropout ATen ran on kiln's buffer)."""
    def f(a, b):
        t = F.gelu(a)
        return t, F.dropout(t, 0.5, training=True), b * 1.5

    compiled = kiln.compile(f, backend=backend, dynamic=True)
    for requires_grad in (False, True):
        a, b = torch.randn(3, 2, dtype=torch.float64).t().requires_grad_(requires_grad), torch.randn(4, 3)
        expected, actual = [(torch.manual_seed(3), fn(a, b))[1] for fn in (f, compiled)]
        assert torch.equal(actual[1] != 0, expected[1] != 0), "the mask differs from eager's"
        torch.testing.assert_close(actual, expected)


ON = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("operand", ["strided slice", "transposed"])
def test_dropout_while_training_gets_its_operand_with_eager_strides(operand):
    """On CUDA, ATen's dropout picks its kernel by the operand's strides, and the generator offset of each element
    with it: an operand passed as a dense copy of a strided slice draws other numbers (fuzz seed 442898 on the GPU),
    so the operand keeps eager's strides, and a value kiln stored in another order gets them (442727)."""
    def f(a):
        t = a[::2] if operand == "strided slice" else F.gelu(a).t()
        return F.dropout(t, 0.5, training=True), a * 2

    compiled = kiln.compile(f)
    a = torch.randn(64, 48, device=ON, requires_grad=True)
    expected, actual = [(torch.manual_seed(7), fn(a))[1] for fn in (f, compiled)]
    assert torch.equal(actual[0] != 0, expected[0] != 0), "the mask differs from eager's"


def test_a_draw_in_place_taken_from_the_compile_cache_keeps_eager_mask(fresh_cache):
    """The drawn op prints as Python that a cached graph runs again: a warm compile draws eager's numbers too."""
    def f(a):
        mask, slice_drawn = F.dropout(a, 0.5, training=True), torch.empty(6, 4).t()[:, ::2].uniform_(-1, 1)
        return a.exp(), torch.cat([mask.flatten(), slice_drawn.flatten()])

    hits = aot_cache.stats["hits"]
    for _ in range(2):
        kiln.reset()
        _same_draws(f, kiln.compile(f), torch.randn(2, 4, 7).permute(2, 0, 1), seed=5)
    assert aot_cache.stats["hits"] == hits + 1
