"""Gradients of ops whose eager formula looks at the data: the compiled backward gives eager's, inf and NaN included.

Eager's `prod` backward divides the product by each element where the input holds no zero (NaN at an inf
element, NaN across a row holding a NaN), multiplies the other elements where it holds one, and gives zeros for
two zeros or more; `max()`, `min()` and `median()` spread the gradient over the elements equal to the result and
give the others zeros, an inf gradient included. Traced on fake tensors, autograd takes other branches (the
products of the others; the mask times the gradient), which differ exactly there (fuzz seeds 104093, 400004).
Eager and kiln side by side, values and gradients compared with NaN where eager has NaN.
"""
import pytest
import torch

import kiln

INF, NAN = float("inf"), float("nan")


def full_product(x):
    return x.prod() * 2


def product_of_columns(x):
    return torch.prod(x.reshape(2, -1), 0) * 2


def product_of_rows_kept(x):
    return x.reshape(2, -1).prod(dim=1, keepdim=True) * 2


def product_in_double(x):
    return x.reshape(2, -1).prod(-1, dtype=torch.float64)


def scaled_then_product(x):
    return (x * 3).reshape(x.shape[0], -1).prod(0)  # fuzz seed 104093's shape


PRODUCTS = [full_product, product_of_columns, product_of_rows_kept, product_in_double, scaled_then_product]

INPUTS = {
    "inf_no_zero": [-0.5, INF, -1.0, 2.0, 0.25, 3.0],  # eager: inf / inf = nan at the inf element
    "nan": [1.0, NAN, 2.0, 0.5, -1.0, 4.0],
    "one_zero_and_inf": [0.0, INF, 2.0, 0.5, -1.0, 4.0],  # eager: the products of the others
    "two_zeros_and_inf": [0.0, INF, -0.0, 0.5, -1.0, 4.0],  # eager, full reduction: zeros
    "finite": [0.5, -2.0, 1.5, 3.0, -0.25, 1.0],
}


def values_and_gradient(fn, values: list[float]):
    x = torch.tensor(values, requires_grad=True)
    y = fn(x)
    return y.detach(), torch.autograd.grad(y, x, torch.ones_like(y))[0]


def assert_same(actual, expected):
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, equal_nan=True)


@pytest.mark.sampled(every=2, classes=("program", "values"))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("values", INPUTS.values(), ids=INPUTS.keys())
@pytest.mark.parametrize("program", PRODUCTS, ids=lambda f: f.__name__)
def test_product_gradient_is_eagers(program, values, backend):
    compiled = kiln.compile(program, backend=backend)
    assert_same(values_and_gradient(compiled, values), values_and_gradient(program, values))


def largest_amplified(x):
    return (x.max() * 1e30) ** 2  # the gradient reaching max() is inf


def smallest_times_nan(x):
    return x.min() * NAN


def median_amplified(x):
    return (torch.median(x) * 1e30) ** 2


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [largest_amplified, smallest_times_nan, median_amplified],
                         ids=lambda f: f.__name__)
def test_picked_element_gradient_leaves_the_others_zero(program, backend):
    compiled = kiln.compile(program, backend=backend)
    values = [1.0, 3.0, 2.0, 3.0, -1.0]  # a tie at the maximum: the gradient is shared
    expected = values_and_gradient(program, values)
    assert_same(values_and_gradient(compiled, values), expected)
    assert (expected[1] == 0).sum() >= 2  # the others are zeros in eager, not 0 * inf


def product_then_double_backward(x):
    y = x.prod()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    return g.sum()


SECOND_ORDER_INPUTS = {"finite": INPUTS["finite"], "one_zero": [0.5, 0.0, 1.5, 3.0, -0.25, 1.0]}


@pytest.mark.parametrize("values", SECOND_ORDER_INPUTS.values(), ids=SECOND_ORDER_INPUTS.keys())
def test_product_second_derivative_inside_the_graph(values):
    compiled = kiln.compile(product_then_double_backward, backend="aot_eager")
    assert_same(values_and_gradient(compiled, values), values_and_gradient(product_then_double_backward, values))


def product(x):
    return x.prod()


def second_derivative(fn, values: list[float]):
    x = torch.tensor(values, requires_grad=True)
    (g,) = torch.autograd.grad(fn(x), x, create_graph=True)
    return g.detach(), torch.autograd.grad(g.sum(), x)[0]


@pytest.mark.parametrize("values", SECOND_ORDER_INPUTS.values(), ids=SECOND_ORDER_INPUTS.keys())
def test_compiled_product_differentiated_twice(values):
    """The gradient of a compiled product, differentiated again: eager's branch is the only one with a gradient
    (at a zero, the quotient branch's 0 / 0 reaches no one)."""
    compiled = kiln.compile(product, backend="aot_eager")
    assert_same(second_derivative(compiled, values), second_derivative(product, values))
