"""Constants in Triton kernels compile in every dtype: checked under the interpreter AND compiled for sm_90.

A constant is printed inline as a Python literal (`0.0`, `7`, `True`). Triton's compiler takes a literal as
a scalar where it needs a block: a store of a constant (`tl.store(p, kiln_to_bf16(0.0), mask)`, a sibling-fused
kernel zeroing the gradients of a bf16 model), a constant passed to a helper that reads its `.dtype`, a
reduction of a constant. The interpreter accepts much of that, so each case here runs under the interpreter
against eager and then compiles every kernel for an H100 (tests/support/triton_sm90.py) without running it.
The constants' values are the dtype's values (rounded to bf16/fp16, wrapped to uint8, int64 past int32), as
eager's are.

The looped float32 reduction of constants runs under `KILN_TRITON_SWEEP=1` (or KILN_FULL_TESTS=1) only: CI loops
the bfloat16 and int64 ones.
"""
from __future__ import annotations

import pytest
import torch

from support.triton_device import skip_module_unless_kernels_run

skip_module_unless_kernels_run()

from kiln.codegen.triton.heuristics import PERSISTENT_MAX_RBLOCK  # noqa: E402
from support.lowering import assert_same, compile_for_triton  # noqa: E402
from support.sweeps import full  # noqa: E402
from support.triton_sm90 import assert_compiles_for_sm90  # noqa: E402

FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
INTS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
DTYPES = FLOATS + INTS + [torch.bool]
LOOPED = PERSISTENT_MAX_RBLOCK + 37  # a row too long for one block: the reduction loops


def check(fn, *inputs, max_kernels=None, exact=()):
    """`fn` compiled for the Triton target matches eager (the outputs numbered in `exact` bit for bit), and
    each of its kernels compiles for sm_90."""
    compiled, inputs, builds = compile_for_triton(fn, *inputs)
    with torch.no_grad():
        got, expected = compiled(*inputs), fn(*inputs)
    assert_same(got, expected)
    for k in exact:
        assert torch.equal(got[k], expected[k]), (k, got[k], expected[k])
    if max_kernels is not None:
        assert compiled.num_kernels <= max_kernels, compiled.artefacts["kernels.py"]
    assert_compiles_for_sm90(builds)
    return compiled


def value_of(dtype):
    """A constant of `dtype` that its compute type holds inexactly or at an edge (bf16 rounds 0.1; 300 wraps
    in uint8)."""
    return {torch.bool: True, torch.uint8: 300 % 256, torch.int8: -7, torch.int16: -300, torch.int32: 1 << 30,
            torch.int64: 1 << 40}.get(dtype, 0.1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_stored_constant_in_every_dtype(dtype):
    """A constant fill is a store of a literal: the literal made a value of the buffer's dtype."""
    x = torch.randn(5, 9)
    check(lambda x: (torch.zeros(5, 9, dtype=dtype, device=x.device),
                     torch.full((3, 7), value_of(dtype), dtype=dtype, device=x.device), x + 1), x,
          exact=(0, 1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_cast_constant_in_every_dtype(dtype):
    """A constant cast to another dtype takes that dtype's value (0.1 as bf16 is 0.10009765625) wherever it is
    used: stored, or an operand."""
    x = torch.randn(4, 6).to(dtype) if dtype.is_floating_point else torch.randint(0, 5, (4, 6)).to(dtype)
    def program(x):
        def full(value):
            return torch.full((4, 6), value, device=x.device).to(dtype)
        return full(0.1), full(2.7) + x, full(-3.5), x * full(3)

    check(program, x, exact=(0, 2))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_constants_in_where_keep_the_dtype(dtype):
    """tl.where of two literals picks Triton's type for a Python scalar (int32, float32); the result must be
    the where's dtype: an int64 past int32 plus one, a float64 that float32 would round."""
    x = torch.randn(5, 8)
    big = {torch.int64: 2**31 - 1, torch.float64: 0.1 + 2**-40}.get(dtype, value_of(dtype))
    check(lambda x: (torch.where(x > 0, torch.full_like(x, big, dtype=dtype), torch.zeros_like(x, dtype=dtype)) + 1,
                     torch.where(x > 0, x.to(dtype), torch.full_like(x, 1, dtype=dtype))), x)


def _first_operand_constant(dtype):
    """Ops whose first operand is a constant, for each op Triton's kernels call as a function (helpers and
    libdevice read the operand's dtype and shape)."""
    def fn(x):
        c = torch.full_like(x, 7 if not dtype.is_floating_point else 2.5, dtype=dtype)
        outs = [torch.maximum(c, x), torch.minimum(c, x), c * x]
        if dtype != torch.bool:
            outs += [c - x, torch.remainder(c, x), torch.fmod(c, x), torch.div(c, x, rounding_mode="floor"),
                     torch.div(c, x, rounding_mode="trunc")]
        if dtype.is_floating_point:
            outs += [torch.atan2(c, x), torch.pow(c, x), c / x, torch.copysign(c, x), torch.hypot(c, x)]
        else:  # (Triton's interpreter cannot invert a uint8: its ~ overflows numpy's uint8)
            outs += [c & x, c | x, c ^ x] + ([~c + x] if dtype != torch.uint8 else [])
        return outs
    return fn


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_constant_first_operand_in_every_dtype(dtype):
    x = (torch.rand(4, 7) * 4 + 0.5).to(dtype) if dtype.is_floating_point else torch.randint(1, 9, (4, 7)).to(dtype)
    check(_first_operand_constant(dtype), x)


def _reduced_constants(dtype):
    def fn(x):
        one = torch.ones_like(x)
        outs = [one.sum(1), one.amax(1), one.argmax(1), x.sum(1) + one.sum(1)]
        if dtype == torch.int64:
            return [*outs, torch.full_like(x, 2**31 - 1).sum(1)]
        return [*outs, (one * 2).prod(1), torch.var_mean(one, 1)[0]]
    return fn


# a looped reduction costs the interpreter seconds: CI loops the half and int64 ones (KILN_TRITON_SWEEP=1: all)
@pytest.mark.parametrize("dtype, rows", [
    pytest.param(dtype, rows, id=f"{dtype}-{kind}") for dtype in (torch.float32, torch.bfloat16, torch.int64)
    for kind, rows in (("persistent", 9), ("looped", LOOPED))
    if kind == "persistent" or dtype != torch.float32 or full("KILN_TRITON_SWEEP")])
def test_reductions_of_constants(dtype, rows):
    """A reduction whose value is a constant (a count, a constant's max) reduces a block of the constant's
    dtype, not a scalar (nor int32 lanes: an int64 sum of 2**31 - 1 overflows them)."""
    x = torch.randn(3, rows).to(dtype) if dtype.is_floating_point else torch.randint(0, 9, (3, rows))
    check(_reduced_constants(dtype), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.int64], ids=str)
def test_a_sibling_fused_kernel_storing_constants_into_many_buffers(dtype):
    """Issue 28's kernel: a backward's zero gradients of a bf16 model, one fused kernel storing a constant into
    many buffers (beside values it computes)."""
    x = torch.randn(16, 64).to(dtype) if dtype.is_floating_point else torch.randint(0, 9, (16, 64))
    fn = lambda x: [torch.zeros_like(x) for _ in range(24)] + [x * 2, torch.full_like(x, 3)]  # noqa: E731
    check(fn, x, max_kernels=2, exact=range(24))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float64: torch.int64, torch.float32: torch.int32}.get(t.dtype, torch.int16))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_negative_zero_keeps_its_sign(dtype):
    """Triton makes every constant equal to 0 its +0.0, so `-0.0 * x` was +0.0 * x (the zeros' signs flipped, seen
    through a bit view; fuzz seed 457716 on the cpu-triton device, the same on the GPU); negative zero is made
    from its bits. Stored, multiplied, and in a where."""
    x = torch.tensor([1.0, -1.0, 2.5, 0.0, -3.0], dtype=dtype)

    def fn(x):
        return (_bits(torch.full_like(x, -0.0) * x), _bits(torch.where(x > 0, torch.full_like(x, -0.0), x)),
                _bits(torch.full_like(x, -0.0)))

    check(fn, x, exact=(0, 1, 2))
