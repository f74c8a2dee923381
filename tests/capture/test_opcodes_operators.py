"""Operators on tensors and constants, strings and f-strings, math and operator modules."""
import math
import operator

import pytest
import torch

from support.capture import check, t

BINARY = [
    ("add", lambda a, b: a + b),
    ("sub", lambda a, b: a - b),
    ("mul", lambda a, b: a * b),
    ("truediv", lambda a, b: a / b),
    ("floordiv", lambda a, b: a // b),
    ("mod", lambda a, b: a % b),
    ("pow", lambda a, b: a.abs() ** b),
    ("matmul", lambda a, b: a @ b.T),
    ("lt", lambda a, b: a < b),
    ("le", lambda a, b: a <= b),
    ("eq", lambda a, b: a == b),
    ("ne", lambda a, b: a != b),
    ("gt", lambda a, b: a > b),
    ("ge", lambda a, b: a >= b),
    ("max", lambda a, b: torch.maximum(a, b)),
]


@pytest.mark.parametrize("name,op", BINARY, ids=[b[0] for b in BINARY])
def test_binary_tensor_tensor(name, op):
    check(op, t(3, 3), t(3, 3), graphs=1, fullgraph=True)


@pytest.mark.parametrize("name,op", BINARY[:7], ids=[b[0] for b in BINARY[:7]])
def test_binary_tensor_scalar_both_sides(name, op):
    def fn(x):
        return op(x, 2.5), op(3.0, x.abs() + 1) if name != "pow" else op(x, 2)
    check(fn, t(4), graphs=1, fullgraph=True)


INT_OPS = [
    ("and", lambda a, b: a & b),
    ("or", lambda a, b: a | b),
    ("xor", lambda a, b: a ^ b),
    ("lshift", lambda a, b: a << 1),
    ("rshift", lambda a, b: a >> 1),
    ("invert", lambda a, b: ~a),
    ("neg", lambda a, b: -a),
]


@pytest.mark.parametrize("name,op", INT_OPS, ids=[b[0] for b in INT_OPS])
def test_integer_tensor_ops(name, op):
    a = torch.randint(0, 8, (5,))
    b = torch.randint(0, 8, (5,))
    check(op, a, b, graphs=1, fullgraph=True)


INPLACE = [
    ("iadd", "x += y"), ("isub", "x -= y"), ("imul", "x *= y"), ("idiv", "x /= y"),
]


@pytest.mark.parametrize("name,stmt", INPLACE, ids=[b[0] for b in INPLACE])
def test_augmented_assignment_on_tensor(name, stmt):
    ns = {}
    exec(f"def fn(x, y):\n    x = x.clone()\n    {stmt}\n    return x", ns)
    check(ns["fn"], t(3, grad=True), t(3).abs() + 1, graphs=1, fullgraph=True)


def unary_ops(x):
    return -x, +x, abs(x), ~(x > 0)


def python_scalar_arith(x):
    a = 7
    b = 2
    vals = (a + b, a - b, a * b, a / b, a // b, a % b, a ** b, -a, a << 1, a >> 1, a & b, a | b, a ^ b, ~a)
    return x * sum(vals)


def float_int_mix(x):
    n = x.shape[0]
    return x * (n / 2) + (n // 2) + float(n) + int(2.7) + round(2.5) + round(3.14159, 2)


def augmented_constant(x):
    k = 1
    k += 2
    k *= 3
    k -= 1
    k //= 2
    return x * k


def math_module(x):
    return x * math.sqrt(16) + math.pi + math.floor(2.7) + math.ceil(1.2) + math.log(math.e) + math.cos(0.0)


def math_on_shape(x):
    return x * math.prod(x.shape) + math.isqrt(x.numel())


def operator_module(x):
    return operator.add(x, 1), operator.mul(x, x), operator.getitem([x, x * 2], 1), operator.neg(x)


def string_ops(x):
    s = "abc"
    parts = "a,b,c".split(",")
    name = "_".join(parts).upper()
    flags = (s.startswith("a"), s.endswith("c"), "b" in s, s.replace("b", "x"), s[1:], s * 2, s + "d")
    return x * len(name) + len(flags[3]), flags


def fstring(x, name):
    label = f"{name}-{x.shape[0]}:{x.dim():03d}"
    return x * len(label), label


def fstring_repr_conversion(x):
    s = f"{'q'!r} {1.5!s} {x.dtype}"
    return x + len(s), s


def str_format_method(x):
    s = "{}-{:.2f}".format("w", 3.14159)
    return x * len(s), s


def bool_int_conversions(x):
    return x * (int(True) + float("1.5") + int("3") + bool(0) + bool([1]))


def comparisons_on_dtype(x):
    if x.dtype == torch.float32 and x.device.type == "cpu" and x.is_floating_point():
        return x * 2
    return x * 3


def identity_ops(x, y):
    a = x is y
    b = x is not None
    return x * (int(a) + int(b)), a


def tensor_compare_chain(x):
    return (x > 0) & (x < 1), (x < -1) | (x > 1)


def rsub_rdiv(x):
    return 1 - x, 2 / (x.abs() + 1), 2 ** x, 10 % (x.abs() + 1)


def divmod_pow(x):
    q, r = divmod(17, 5)
    return x * q + r + pow(2, 3)


def tensor_scalar_compare_python_bool(x):
    n = x.size(0)
    return x * (n > 2), x * (n == 3)


def hash_and_id_free(x):
    d = {("a", 1): x}
    return d[("a", 1)] * 2


CASES = [
    (unary_ops, (t(3, grad=True),)),
    (python_scalar_arith, (t(3),)),
    (float_int_mix, (t(4),)),
    (augmented_constant, (t(3),)),
    (math_module, (t(3),)),
    (math_on_shape, (t(2, 8),)),
    (operator_module, (t(3),)),
    (string_ops, (t(3),)),
    (fstring, (t(3), "layer")),
    (fstring_repr_conversion, (t(3),)),
    (str_format_method, (t(3),)),
    (bool_int_conversions, (t(3),)),
    (comparisons_on_dtype, (t(3),)),
    (comparisons_on_dtype, (torch.arange(3),)),
    (identity_ops, (t(3), None)),
    (tensor_compare_chain, (t(5),)),
    (rsub_rdiv, (t(3),)),
    (divmod_pow, (t(3),)),
    (tensor_scalar_compare_python_bool, (t(3),)),
    (hash_and_id_free, (t(3),)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_operators_one_graph(fn, args):
    check(fn, *args, graphs=1, records=1, fullgraph=True)
