"""A Python number made dynamic (its value changed between calls) meets a 0-d tensor: eager's dtype and values.

kiln makes such a number a graph input, a 0-d int64 or float64 tensor. Against a tensor with dimensions that
promotes as the Python number does, but two 0-d tensors promote to the wider dtype: `t.sum() + x` came out
float64 where eager's is float32 (and a comparison ran in float64 where eager's runs in float32). The number
now enters the graph at the 0-d partner's dtype (values/operators.py `_as_graph_tensor`). Seen by the fuzzer
after `.item()` in a loop (seed 100712). Each case calls the function with several values of the number, so
the second call makes it dynamic, and compares every result, dtype included, with eager's.
"""
import pytest
import torch

import kiln
from support.capture import assert_same


def plus_after_sum(t, x):
    return t.sum() + x


def number_first(t, x):
    return x - t.sum()


def times_0d(t, x):
    return t[0] * x


def compared(t, x):
    return t.sum() > x, t.sum() == x


def in_place(t, x):
    s = t.sum()
    s += x
    return s


def via_item(t, x):
    total = t.sum().item() + x
    print(end="")  # the break makes `total` a number the continuation receives
    return t.sum() + total


CASES = {
    "plus_after_sum": plus_after_sum, "number_first": number_first, "times_0d": times_0d, "compared": compared,
    "in_place": in_place, "via_item": via_item,
}
# (dtype of t, numbers passed call after call): floats with float32/bfloat16/float64, ints with int32/int64/bool
INPUTS = {
    "float32": (torch.float32, [0.1, 0.7, -2.3]),
    "bfloat16": (torch.bfloat16, [0.1, 0.3, 1.9]),
    "float64": (torch.float64, [0.1, 0.7, -2.3]),
    "int32": (torch.int32, [3, 5, -7]),
    "int64": (torch.int64, [3, 5, -7]),
    "bool_with_int": (torch.bool, [3, 5, -7]),
}


def make(dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([True, False, True])
    return (torch.arange(3) * 0.35 + 0.1).to(dtype) if dtype.is_floating_point else torch.arange(3, dtype=dtype)


@pytest.mark.parametrize("dtype_name", INPUTS)
@pytest.mark.parametrize("name", CASES)
def test_dynamic_number_with_a_0d_tensor_keeps_eagers_dtype(name, dtype_name):
    fn, (dtype, numbers) = CASES[name], INPUTS[dtype_name]
    if name == "via_item" and dtype == torch.bool:
        pytest.skip("a bool tensor's sum is int64: the int64 case covers it")
    compiled = kiln.compile(fn, backend="eager")
    t = make(dtype)
    for x in numbers:
        assert_same(fn(t, x), compiled(t, x), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(64,), ()], ids=["with dims", "0-d"])
def test_dynamic_float_with_a_half_type_tensor_computes_as_eager(dtype, shape):
    """Eager multiplies a half-type tensor by a Python float in float32, from the float itself; kiln's kernels
    round a 0-d tensor operand to the half type first (off by an ulp of it). So the float stays specialized
    against a half type, under kiln's default backend too."""
    torch.manual_seed(0)
    compiled = kiln.compile(lambda t, x: t * x)
    t = torch.randn(shape).to(dtype)
    for x in (1.1, 2.2360679774997896, 2.6457513110645907):
        assert_same(compiled(t, x), t * x, atol=0, rtol=0)
