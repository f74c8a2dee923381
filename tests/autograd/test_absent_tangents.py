"""An output the loss does not reach: eager runs none of its backward formulas, so none can make NaN.

Autograd passes the compiled backward None for such an output; a zero tangent in its place is the same in
exact arithmetic, but `0 / 0` and `0 * inf` in formulas eager never runs (sqrt's at 0, div's by 0) turn
finite gradients into NaN. Each program has an output whose backward makes an infinity where another,
reached output's gradient flows too; the loss starts from the other outputs only.
"""
import pytest
import torch

import kiln
from support.differential import check


def sqrt_of_zero(b):  # d sqrt(x)/dx at 0 is inf; eager never multiplies it by the absent zero
    t = (b.floor().sin() / b) - b.floor()
    return t, torch.sqrt(t)


def div_by_zero(b):
    z = b * 0
    return b * 3, b / z


def log_of_zero(b):
    z = b.relu() * 0
    return b.sin(), torch.log(z + b * 0)


def shared_view(b):  # the unreached output is a view through which the infinity flows
    t = b - b
    return t * 2, t.rsqrt().view(-1)


def pow_negative(b):
    z = b * 0
    return (b * z).sum(), z.pow(-1.5).sum(0)


def complex_view_of_an_infinite_gradient(b):
    # the absent tangent of `c` is summed with the gradient through `c.real` (inf + 0j): a complex add scales by
    # alpha as a complex product, giving inf + nan j, which the product by 1.5 carries into the real part
    c = b.to(torch.complex64) * 1.5
    return (c.real * 100).exp(), c


PROGRAMS = [sqrt_of_zero, div_by_zero, log_of_zero, shared_view, pow_negative, complex_view_of_an_infinite_gradient]


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_unreached_output_makes_no_nan(program, backend):
    def make(call):
        return (torch.linspace(-1.5, 1.5, 12).reshape(3, 4).requires_grad_(),)
    check(program, make, backend, calls=2, loss_from=[0])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_all_outputs_reached_then_one_skipped(backend):
    """One compiled graph serves both: the full backward (NaN where eager's is), then the variant without
    the second output (finite, as eager's)."""
    compiled = kiln.compile(sqrt_of_zero, backend=backend)

    def make(call):
        return (torch.linspace(-1.5, 1.5, 12).reshape(3, 4).requires_grad_(),)
    grads = []
    for fn in (sqrt_of_zero, compiled):
        (b,) = make(0)
        torch.autograd.backward([o.sum() for o in fn(b)])
        grads.append(b.grad)
    assert grads[0].isnan().any()
    torch.testing.assert_close(grads[1], grads[0], equal_nan=True)
    check(sqrt_of_zero, make, backend, compiled=compiled, loss_from=[0])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_gradient_summed_with_an_absent_one_keeps_its_sign_of_zero(backend):
    """`0.0 + -0.0` is `+0.0`: the zero of an unreached output's contribution added to a reached gradient of
    -0.0 flipped its sign, where eager never adds it (fuzz seed 442951's class: the sum is the reached gradient)."""
    def f(b):
        return b * -0.0, b * 2

    grads = []
    for fn in (f, kiln.compile(f, backend=backend)):
        b = torch.ones(3, requires_grad=True)
        fn(b)[0].sum().backward()
        grads.append(b.grad)
    assert torch.equal(grads[1].signbit(), grads[0].signbit()) and grads[0].signbit().all()
