"""`math` and rounding on symbolic sizes stay symbolic (kiln/capture/values/symbolic_math.py).

`math.ceil(n / 2)`, `math.floor`, `math.trunc`, `math.sqrt`, `int(n / 2)` and `round(n / 3)` of a dynamic size
(`dynamic=True`, or automatic dynamic after a size changed) are graph nodes over SymFloats, as under torch.compile,
not a specialization per value: one graph serves every size. Each case compares the graphs made for six sizes with
torch.compile's and the values with eager's. Rounded divisions used as sizes compile with kiln's own code generator
(kiln/lower/index.py `integer_rounding` writes them as integer floor divisions).
"""
import math

import pytest
import torch

import kiln
from support.capture import CountingBackend, assert_same

SIZES = (4, 5, 6, 7, 9, 12)


CASES = {
    "ceil as a slice bound": lambda x: x[:math.ceil(x.shape[0] / 2)] * 2,
    "floor as a slice bound": lambda x: x[:math.floor(x.shape[0] / 3)] + 1,
    "trunc as a slice bound": lambda x: x[:math.trunc(x.shape[0] / 2)] + 1,
    "int() as a slice bound": lambda x: x[:int(x.shape[0] / 2)] + 1,
    "round() as a slice bound": lambda x: x[:round(x.shape[0] / 3)] + 1,
    "ceil as a size": lambda x: x.new_ones(math.ceil(x.shape[0] / 2), 2) * x.shape[1],
    "sqrt as a factor": lambda x: x * math.sqrt(x.shape[0]),
    "log2 as a factor": lambda x: x * math.log2(x.shape[0]),
    "round with digits as a factor": lambda x: x * round(x.shape[0] / 3, 1),
    "ceil of an int": lambda x: x[:math.ceil(x.shape[0])] + 1,
}


# CI: each expression under one of the two ways sizes become symbolic, each way for half of them
# (KILN_MATRIX_SWEEP=1: both for every expression)
@pytest.mark.sampled(every=2, classes=("name", "dynamic"))
@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic dynamic"])
@pytest.mark.parametrize("name", list(CASES))
def test_math_on_a_dynamic_size_stays_symbolic(name, dynamic):
    fn = CASES[name]
    torch._dynamo.reset()
    backend, torch_backend = CountingBackend(), CountingBackend()
    compiled = kiln.compile(fn, backend=backend, dynamic=dynamic)
    reference = torch.compile(fn, backend=torch_backend, dynamic=dynamic)
    for n in SIZES:
        x = torch.randn(n, 3)
        assert_same(compiled(x), fn(x))
        reference(x)
    # torch.compile's graphs: one, or two or three where a result is a size 0 or 1 it specializes; a graph per size
    # would be six
    assert backend.graphs <= torch_backend.graphs, (backend.graphs, torch_backend.graphs)


def test_math_on_an_int_input_made_dynamic_stays_symbolic():
    def fn(x, n):
        return x[:math.ceil(n / 2)] + math.floor(n / 3)

    torch._dynamo.reset()
    backend, torch_backend = CountingBackend(), CountingBackend()
    compiled, reference = kiln.compile(fn, backend=backend), torch.compile(fn, backend=torch_backend)
    x = torch.randn(12, 3)
    for n in SIZES:
        assert_same(compiled(x, n), fn(x, n))
        reference(x, n)
    assert backend.graphs <= torch_backend.graphs


ROUNDED_SIZES = {
    **{name: CASES[name] for name in ("ceil as a slice bound", "floor as a slice bound", "int() as a slice bound",
                                      "round() as a slice bound", "ceil as a size")},
    "round() of halves as a size": lambda x: x.new_ones(round(x.shape[0] / 2), 2) * x.shape[0],  # 2.5 -> 2, 3.5 -> 4
    "round() by four as a slice bound": lambda x: x[:round(x.shape[0] / 4)] + 1,
}


@pytest.mark.parametrize("name", list(ROUNDED_SIZES))
def test_rounded_sizes_compile_with_kilns_code_generator(name):
    """The default backend: the rounded division is integer arithmetic in the wrapper and kernels (Python's round
    takes a half to the even neighbour) (strict mode: a graph that fell back to ATen would raise)."""
    fn = ROUNDED_SIZES[name]
    compiled = kiln.compile(fn, dynamic=True)
    for n in (*SIZES, 10, 11, 14):
        x = torch.arange(n * 3.0).view(n, 3)
        assert_same(compiled(x), fn(x))


def test_a_rounded_size_that_makes_an_invalid_shape_raises_eagers_error():
    def fn(x):
        return x.reshape(math.ceil(x.shape[0] / 2), -1).sum(0)

    compiled = kiln.compile(fn, dynamic=True)
    assert_same(compiled(torch.ones(4, 3)), fn(torch.ones(4, 3)))
    with pytest.raises(RuntimeError, match="invalid for input of size 21"):
        fn(torch.ones(7, 3))
    with pytest.raises(RuntimeError, match="invalid for input of size 21"):
        compiled(torch.ones(7, 3))


FLOAT_CASES = {
    "divided by a float32 tensor": (lambda x: x / math.sqrt(x.shape[-1]), torch.float32),
    "times a float64 tensor": (lambda x: x * (x.shape[0] / 3), torch.float64),
    "times a 0-d float32 tensor": (lambda x: x.amax() * math.log2(x.shape[0]), torch.float32),  # no sum: exact
    "times an int64 tensor": (lambda x: x * math.sqrt(x.shape[0]), torch.int64),
}


@pytest.mark.parametrize("name", list(FLOAT_CASES))
def test_a_float_computed_from_sizes_compiles_with_kilns_code_generator(name):
    """A symbolic float meeting a tensor enters the graph as a 0-d input the program computes from the call's
    sizes, at the dtype eager converts the number to (strict mode: a graph run through ATen would raise)."""
    fn, dtype = FLOAT_CASES[name]
    compiled = kiln.compile(fn, dynamic=True)
    for n in SIZES:
        x = (torch.randn(n, 3) * 10).to(dtype)
        assert_same(compiled(x), fn(x), atol=1e-6, rtol=1e-6)
    assert len(kiln.api.context_of(compiled).records) == 1


NARROW_CASES = {
    "times the square root of a size": lambda x: x * math.sqrt(x.shape[-1]),
    "divided by the square root of a size": lambda x: x / math.sqrt(x.shape[-1]),
    "plus a size ratio": lambda x: x + x.shape[0] / 3,
    "a size ratio minus": lambda x: x.shape[0] / 3 - x,
    "a size ratio as alpha": lambda x: torch.add(x, x.flip(0), alpha=x.shape[0] / 3),
    "filled with a size ratio": lambda x: x + torch.full((x.shape[0], 1), x.shape[1] / 3, dtype=x.dtype),
    "where with a size ratio": lambda x: torch.where(x.abs() > 1, x, x.shape[0] / 3),
    "compared with a size ratio": lambda x: x.abs() > x.shape[0] / 3,
}


@pytest.mark.sampled(every=3, classes=("name", "dtype"))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.complex64])
@pytest.mark.parametrize("name", list(NARROW_CASES))
def test_a_float_computed_from_sizes_meets_a_half_or_complex_tensor(name, dtype):
    """A half-type tensor reads the float as eager does (rounded to the half type for add and sub, at its value in
    float for mul and div: kiln/lower/scalar_operands.py), bit for bit; complex ops run through ATen, given the
    float as a Python float the wrapper computes from the sizes (strict mode: no graph falls back)."""
    fn = NARROW_CASES[name]
    compiled = kiln.compile(fn, dynamic=True)
    for n in (5, 7, 12):  # 64 columns: eager computes every element in its vectorized loop
        x = torch.randn(n, 64, generator=torch.Generator().manual_seed(n)) * 5
        x = torch.complex(x, x.flip(0)) if dtype.is_complex else x.to(dtype)
        expected, actual = fn(x), compiled(x)
        assert actual.dtype == expected.dtype and torch.equal(actual, expected), (n, (actual != expected).sum())


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_a_float_of_the_sizes_as_alpha_of_an_integer_op_raises_eagers_error(dtype):
    """`alpha` may not be a float for integer tensors: eager raises, and so does the compiled graph (the op runs
    through ATen with the Python float, instead of a kernel adding `x * 1.5`)."""
    def fn(x):
        return torch.add(x, x, alpha=x.shape[0] / 2)

    compiled = kiln.compile(fn, dynamic=True)
    x = torch.arange(6).view(3, 2).to(dtype)
    with pytest.raises(RuntimeError, match="alpha must not be a floating point number"):
        fn(x)
    with pytest.raises(RuntimeError, match="alpha must not be a floating point number"):
        compiled(x)
