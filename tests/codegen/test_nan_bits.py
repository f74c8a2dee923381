"""NaN bits beside eager's CPU kernels, viewed as integers (kiln/codegen/cpp/prelude.h, codegen/cpp/kernel.py).

IEEE leaves the sign and payload of most NaN results open; eager's CPU kernels fix some of them, and a program that
views a result as integers (`.view(torch.int16)`) sees those bits. Eager has two loops per elementwise op, which
make different NaNs: its scalar loop (every element of a tensor shorter than a vector, a vector loop's tail, every
element where an operand is strided) converts a bf16 op's NaN to 0x7fc0 (c10's rule) and propagates an operand's
NaN through maximum and minimum; its vectorized loop makes a bf16 NaN 0xffff (ATen's cvtfp32_bf16) and a
maximum's NaN all ones. kiln follows the scalar loop, which the small tensors of most programs that look at NaN
bits see; the vectorized loop's rules are strict xfails here. Both loops keep a NaN's bits where they move it
(copies, `where`); its scalar loop computes a bf16 negation or absolute value through float (a NaN is 0x7fc0).

NaNs whose bits come from the hardware or libm (0 * inf, sqrt(-1), a NaN meeting a NaN) are not here: x86 returns
one of the operands' NaN and the C++ compiler may swap a commutative op's operands, so their bits are not a
property kiln's source can fix.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from support.triton_device import DEVICE

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
AS_INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
          torch.float64: torch.int64}
NAN_BITS = {torch.float16: [0x7E00, 0xFE00, 0x7E01], torch.bfloat16: [0x7FC0, 0xFFC0, 0x7FC1],
            torch.float32: [0x7FC00000, 0xFFC00000, 0x7FC00001],
            torch.float64: [0x7FF8000000000000, -0x8000000000000, 0x7FF8000000000001]}


def _nans_and_numbers(dtype: torch.dtype, n: int) -> torch.Tensor:
    """NaNs of both signs and of a non-default payload between numbers, inf and zeros: `n` elements."""
    nans = torch.tensor(NAN_BITS[dtype], dtype=torch.int64).to(AS_INT[dtype]).view(dtype)  # wraps to signed bits
    numbers = torch.tensor([0.0, -0.0, 1.5, -2.0, float("inf"), float("-inf")], dtype=dtype)
    pattern = torch.cat([nans, numbers, nans.flip(0), numbers.flip(0)])
    return pattern.repeat(n // len(pattern) + 1)[:n]


def _numbers(dtype: torch.dtype, n: int) -> torch.Tensor:
    """Numbers only, inf and zeros among them (0 * inf and inf - inf make NaNs): `n` elements."""
    return torch.tensor([1.0, float("inf"), 0.0, float("-inf"), -3.0, 2.5, -0.0], dtype=dtype).repeat(n)[:n]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(AS_INT[t.dtype]) if t.dtype in AS_INT else t


OPS = {  # x holds NaNs, y numbers only: a NaN never meets a NaN (x86 returns either's, as the compiler orders)
    "x * 1": lambda x, y: x * 1,
    "x + y": lambda x, y: x + y,
    "0 * inf": lambda x, y: y * y.roll(1),
    "relu": lambda x, y: torch.relu(x),
    "clamp": lambda x, y: x.clamp(-1, 1),
    "maximum": lambda x, y: (torch.maximum(x, y), torch.maximum(y, x)),
    "minimum": lambda x, y: (torch.minimum(x, y), torch.minimum(y, x)),
    "where": lambda x, y: torch.where(y > 0, x, y),
    "neg": lambda x, y: -x,
    "clone": lambda x, y: x.clone(),
    "to float32": lambda x, y: x.float(),
    "to float16": lambda x, y: (x * 1).half(),
    "abs": lambda x, y: x.abs(),
}


def _assert_same_bits(program, *args, what: str) -> None:
    for k, (expected, got) in enumerate(zip(program(*args), kiln.compile(program)(*args))):
        same = expected == got
        assert bool(same.all()), f"{what}, result {k}: {int((~same).sum())} elements differ, e.g. " \
            f"{[hex(v) for v in got[~same][:3].tolist()]} vs eager's {[hex(v) for v in expected[~same][:3].tolist()]}"


# CI: a diagonal of op x dtype, every op and every dtype kept (KILN_MATRIX_SWEEP=1: all of it)
@pytest.mark.sampled(every=2, classes=("op", "dtype"))
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_nan_bits_as_eager_s_scalar_loop_makes_them(op, dtype):
    """Strided operands (every other element of a longer tensor): eager computes every element in its scalar loop."""
    def program(x, y):
        out = OPS[op](x[::2], y[::2])
        return [_bits(t) for t in (out if isinstance(out, tuple) else (out,))]

    kiln.reset()
    _assert_same_bits(program, _nans_and_numbers(dtype, 128), _numbers(dtype, 128), what=f"{op} in {dtype}")


def test_a_bf16_sum_of_a_nan_as_eager():
    """A reduction's result is converted one element at a time, in either loop: a bf16 NaN is 0x7fc0."""
    x = torch.linspace(-4, 4, 512).reshape(64, 8).to(torch.bfloat16)
    x[:, 3] = _nans_and_numbers(torch.bfloat16, 64)
    kiln.reset()
    _assert_same_bits(lambda x: [_bits((x * 1).sum(1))], x, what="sum")


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's conversion; on the GPU the hardware converts")
def test_a_bf16_nan_of_the_triton_target_under_the_interpreter_as_eager_s_scalar_loop():
    """The Triton target's bf16 rounding under the interpreter (libdevice.py) made a NaN 0xffff, as torch's
    vectorized cast does, where eager's floor division stored 0x7fc0 (fuzz seed 449186 on the cpu-triton device)."""
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 1.0, -0.5])

    def program(x):
        return [torch.div(x.to(torch.bfloat16), 0.3, rounding_mode="floor").view(torch.int16)]

    got = kiln.compile(program, options={"cpu_backend": "triton"})(x)[0]
    assert got.tolist() == program(x)[0].tolist()


@pytest.mark.xfail(strict=True, reason="eager's vectorized loop makes a bf16 op's NaN 0xffff (ATen's cvtfp32_bf16) and "
                                       "maximum's NaN all ones; kiln makes them as its scalar loop does")
@pytest.mark.parametrize("op", ["x * 1", "maximum"])
def test_nan_bits_of_eager_s_vectorized_loop(op):
    def program(x, y):
        out = OPS[op](x, y)
        return [_bits(t) for t in (out if isinstance(out, tuple) else (out,))]

    kiln.reset()
    _assert_same_bits(program, _nans_and_numbers(torch.bfloat16, 512), _numbers(torch.bfloat16, 512), what=op)


NEGATIVE_OPERAND_OPS = {"sqrt": torch.sqrt, "log": torch.log, "log2": torch.log2, "x ** 0.5": lambda x: x ** 0.5}


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("op", list(NEGATIVE_OPERAND_OPS))
def test_nan_of_a_negative_operand_as_eager(op, dtype, strided):
    """sqrt, log and log2 of a negative number are +NaN in eager's CPU kernels (MKL's vector math) in either loop;
    x86's sqrt and glibc's log make the negative default NaN. A NaN operand keeps its bits in both (fuzz seed
    200320: a sqrt's NaN reached an optimizer's parameters through the backward, and a later `.view(int16)`).
    Numbers are compared within a tolerance (glibc's log and MKL's differ by an ulp), NaNs by their bits."""
    x = torch.cat([_numbers(dtype, 64) - 2, _nans_and_numbers(dtype, 64)])

    def program(x):
        return NEGATIVE_OPERAND_OPS[op](x[::2] if strided else x)

    kiln.reset()
    expected, got = program(x), kiln.compile(program)(x)
    nan = expected.isnan()
    assert torch.equal(nan, got.isnan()) and bool(nan[:16].any())
    torch.testing.assert_close(got[~nan], expected[~nan])
    assert torch.equal(_bits(got[nan]), _bits(expected[nan])), \
        f"{op} in {dtype}: NaN bits {[hex(v) for v in _bits(got[nan])[:3].tolist()]}, eager's " \
        f"{[hex(v) for v in _bits(expected[nan])[:3].tolist()]}"


# expressions GCC folds where a NaN's sign is not significant to it: `x * -1` into `-x`, `x - (-y)` into `x + y`,
# `(-x) / (-y)` into `x / y`, `fabs(x * x)` into `x * x`; eager computes each op as written
FOLDED_BY_GCC = {
    "x * -1": lambda x, y: x * -1, "x / -1": lambda x, y: x / -1, "-x * -1": lambda x, y: -x * -1,
    "x - (-y)": lambda x, y: x - (-y), "x + (-y)": lambda x, y: x + (-y), "-x + y": lambda x, y: -x + y,
    "(-x) * (-y)": lambda x, y: (-x) * (-y), "(-x) / (-y)": lambda x, y: (-x) / (-y),
    "-(x * y) * 2": lambda x, y: -(x * y) * 2, "(x * x).abs()": lambda x, y: (x * x).abs(),
    "copysign(y, x * x)": lambda x, y: torch.copysign(y, x * x),
}


# CI: a diagonal of op x dtype, every op and every dtype kept (KILN_MATRIX_SWEEP=1: all of it)
@pytest.mark.sampled(every=2, classes=("op", "dtype"))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("op", list(FOLDED_BY_GCC))
def test_nan_bits_of_expressions_gcc_would_fold_as_eager(op, dtype):
    """NaNs of both signs against numbers (a NaN never meets a NaN, whose sign IEEE leaves open), strided: eager's
    scalar loop, one op at a time (its later ops read a contiguous intermediate, in its vectorized loop: whose bf16
    NaN is 0xffff, so bf16 is not here)."""
    def program(x, y):
        return [_bits(FOLDED_BY_GCC[op](x[::2], y[::2]))]

    kiln.reset()
    _assert_same_bits(program, _nans_and_numbers(dtype, 256), _numbers(dtype, 256), what=f"{op} in {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_a_signaling_nan_is_quieted_as_eager(dtype):
    """Eager's product, sum and difference quiet a signaling NaN; GCC would fold `x * 1` and `x - 0` into `x`."""
    signaling = {torch.float32: 0x7F800001, torch.float64: 0x7FF0000000000001}[dtype]
    x = torch.tensor([signaling, -signaling], dtype=torch.int64).to(AS_INT[dtype]).repeat(8).view(dtype)

    def program(x):
        return [_bits(x * 1), _bits(x - 0), _bits(x + -0.0), _bits(x / 1)]

    kiln.reset()
    _assert_same_bits(program, x, what="x * 1, x - 0, x + -0.0, x / 1")
