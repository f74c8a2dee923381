"""Kernels over an int input's symbol, which may be negative (sizes never are).

An int input made a symbol (`kiln.compile(dynamic=True)`, or automatic dynamic once it changes) reaches the
kernels as a size argument: as an index that counts from the end when negative (`x[n]`, `x[n:]`), and in
divisions and remainders that round toward negative infinity as Python's do (`x[n // 2]`). C++ and Triton
truncate toward zero, so the index printer spells those with helpers (`index_printer._over_signed`).
"""
from __future__ import annotations

import pytest
import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, PythonMod

import kiln
from kiln.codegen.index_printer import cexpr, pyexpr
from kiln.codegen.triton.kernel import texpr
from support.capture import assert_same
from support.triton_device import DEVICE, INTERPRETING

TARGETS = ["cpp", pytest.param("triton", marks=pytest.mark.skipif(
    DEVICE != "cpu" or not INTERPRETING, reason="Triton kernels over CPU tensors need TRITON_INTERPRET=1"))]


def rows_from_the_end(x, n):
    return x[n] * 2 + x[n:].sum(0)


def halves_and_remainders(x, n):
    return x[n // 2 + 10] * (n % 3) + x[(n // 3) + 8:].sum(0)


@pytest.mark.parametrize("fn", [rows_from_the_end, halves_and_remainders])
@pytest.mark.parametrize("target", TARGETS)
def test_kernels_read_where_eager_reads(fn, target):
    compiled = kiln.compile(fn, dynamic=True, options={"cpu_backend": target})
    x = torch.randn(20, 4, device=DEVICE)
    for n in (3, -3, 7, -7, 19, -20):
        assert_same(fn(x, n), compiled(x, n))


def test_division_over_a_signed_symbol_prints_with_python_rounding():
    n = sympy.Symbol("s0", integer=True)  # an int input's symbol: its sign unknown
    size = sympy.Symbol("s1", integer=True, positive=True)  # a size's
    assert cexpr(FloorDiv(n, 2)) == "kiln::index_floordiv(s0, 2)"
    assert cexpr(PythonMod(n, 3)) == "kiln::index_mod(s0, 3)"
    assert texpr(FloorDiv(n, 2)) == "kiln_floordiv(s0, 2)"
    assert pyexpr(FloorDiv(n, 2)) == "(s0 // 2)"
    assert cexpr(FloorDiv(size, 2)) == "(s1 / 2)"  # sizes keep the plain operators
