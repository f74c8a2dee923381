"""Edge values, eager and kiln side by side: compiled code raises what eager raises and returns what it returns.

Issue 21, class 6. Each case of the table is an op and inputs at its edges: integer division by zero
(eager raises RuntimeError('ZeroDivisionError')), INT_MIN // -1 (eager wraps; dividing traps with SIGFPE),
indices out of range for every indexed load and store (eager raises RuntimeError or IndexError, by op),
NaN, infinities and signed zeros through the pointwise ops (sign, copysign, min/max/clamp, floor
division, remainder, rounding), integer overflow (abs, neg and pow of INT_MIN). Each case runs eagerly
and through kiln's default backend (the C++ target here); the Triton target runs a subset under the
interpreter.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.pipeline import compile_aten_graph
from support.lowering import trace
from support.triton_device import DEVICE, skip_unless_kernels_run

I64_MIN, I32_MIN = -2 ** 63, -2 ** 31
NAN, INF = float("nan"), float("inf")


def ints(*values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


def floats(*values):
    return torch.tensor(values)


FLOAT_EDGES = floats(1.0, -1.0, 0.0, -0.0, NAN, INF, -INF, 0.5, -2.5)
FLOAT_OTHER = floats(0.0, -0.0, 2.0, NAN, -INF, 0.1, 0.0, -1.0, INF)


def put(x, i):
    y = x.clone()
    y[i] = 1.0
    return y


def scatter_row(x, i):
    """One position per row: kiln lowers this scatter to a select (cross-entropy's backward)."""
    return torch.zeros(2, 5).scatter(1, i[:2, None], -1.0) + x.sum()


# name -> (function, inputs); every function ends in pointwise work so its indexing fuses into a kernel
CASES = {
    # integer division by zero, every spelling and two dtypes
    "floordiv_by_zero": (lambda a, b: a // b + 1, (ints(4, 5, -7), ints(1, 0, 2))),
    "remainder_by_zero": (lambda a, b: a % b + 1, (ints(4, 5, -7), ints(1, 0, 2))),
    "div_floor_by_zero": (lambda a, b: torch.div(a, b, rounding_mode="floor") + 1, (ints(4, 5), ints(0, 1))),
    "div_trunc_by_zero": (lambda a, b: torch.div(a, b, rounding_mode="trunc") + 1, (ints(4, 5), ints(0, 1))),
    "fmod_by_zero": (lambda a, b: torch.fmod(a, b) + 1, (ints(4, 5), ints(3, 0))),
    "floor_divide_by_zero": (lambda a, b: torch.floor_divide(a, b) * 2, (ints(4, 5), ints(3, 0))),
    "remainder_int32_by_zero": (lambda a, b: torch.remainder(a, b) + 1,
                                (ints(4, 5, dtype=torch.int32), ints(0, 1, dtype=torch.int32))),
    "floordiv_by_scalar_zero": (lambda a: a // 0 + 1, (ints(4, 5),)),
    "division_valid": (lambda a, b: (a // b, a % b, torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc")),
                       (ints(7, -7, 7, -7, 0), ints(2, 2, -2, -2, 3))),
    # INT_MIN by -1: eager wraps
    "int64_min_by_minus_one": (lambda a, b: (a // b, a % b, torch.fmod(a, b), torch.floor_divide(a, b)),
                               (ints(I64_MIN, 5), ints(-1, -1))),
    "int32_min_by_minus_one": (lambda a, b: (a // b, a % b),
                               (ints(I32_MIN, 5, dtype=torch.int32), ints(-1, -1, dtype=torch.int32))),
    "int_min_abs_neg": (lambda a: (a.abs(), -a, a.abs() + 1), (ints(I64_MIN, -5, 5),)),
    "int_pow_overflow": (lambda a, b: a ** b, (ints(3, -3, 2, 2, 1, -1, 0), ints(41, 41, 63, -1, -1, -3, 5))),
    # integer overflow that a C++ compiler may assume away (signed overflow is undefined there, wraps in eager):
    # comparisons and divisions of wrapped values must see the wrapped value, not the algebraic one
    "wrapped_negations_compared": (lambda a, b: (torch.where(-a > -b, a, b), -a < -b),
                                   (ints(-2, 3, I64_MIN, 0), ints(I64_MIN, I64_MIN, -2, I64_MIN))),
    "wrapped_sum_compared": (lambda a: (a + 1 > a, a - 1 < a, a + 5 > a + 2), (ints(2 ** 63 - 1, I64_MIN, 3),)),
    "wrapped_int32_sum_compared": (lambda a: (a + 1 > a, a * 2 // 2 == a),
                                   (ints(2 ** 31 - 1, I32_MIN, 3, dtype=torch.int32),)),
    "wrapped_product_divided": (lambda a: (a * 2 // 2, a * 4 // a, (a * 2) % 2 ** 62),
                                (ints(2 ** 62, 2 ** 63 - 1, 3),)),
    "wrapped_abs_sign": (lambda a: (a.abs() >= 0, (a.abs() + 1) > 0, torch.maximum(a.abs(), a)),
                         (ints(I64_MIN, -3, 4),)),
    # NaN, infinities and signed zeros
    "sign_sgn": (lambda x: (torch.sign(x), torch.sgn(x)), (FLOAT_EDGES,)),
    "signbit_copysign": (lambda x, y: (torch.signbit(x), torch.copysign(x, y), torch.copysign(y, x)),
                         (FLOAT_EDGES, FLOAT_OTHER)),
    "maximum_minimum_nan": (lambda x, y: (torch.maximum(x, y), torch.minimum(x, y), torch.fmax(x, y),
                                          torch.fmin(x, y)), (FLOAT_EDGES, FLOAT_OTHER)),
    "clamp_nan": (lambda x, lo: (x.clamp(-0.5, 0.5), x.clamp(min=lo), x.clamp(max=lo), x.clamp(NAN, 1.0),
                                 torch.relu(x)), (FLOAT_EDGES, FLOAT_OTHER)),
    "float_floordiv": (lambda x, y: (x // y, torch.div(x, y, rounding_mode="floor"),
                                     torch.div(x, y, rounding_mode="trunc")), (FLOAT_EDGES, FLOAT_OTHER)),
    "float_floordiv_rounding": (lambda x, y: x // y,
                                (floats(1.0, -1.0, 7.5, 1e300, 0.3), floats(0.1, 0.1, 0.5, 1e-10, 0.1))),
    "float_remainder_fmod": (lambda x, y: (x % y, torch.fmod(x, y)), (FLOAT_EDGES, FLOAT_OTHER)),
    "rounding": (lambda x: (x.round(), x.floor(), x.ceil(), x.trunc()), (floats(0.5, 1.5, 2.5, -0.5, -0.0, NAN, INF),)),
    "integer_rounding_is_identity": (lambda a: (a.floor(), a.round(), a.trunc(), a.ceil()),
                                     (ints(2 ** 63 - 1, I64_MIN + 1, 3),)),
    "half_pow_one_half": (lambda x: x ** 0.5, (floats(-0.0, -INF, 4.0, NAN).half(),)),
    "nan_predicates": (lambda x: (x.isnan(), x.isinf(), torch.isfinite(x), torch.nan_to_num(x)), (FLOAT_EDGES,)),
    # indices out of range: gather-style loads
    "gather_out_of_range": (lambda x, i: torch.gather(x, 0, i) + 1, (torch.randn(5), ints(0, 7))),
    "gather_negative": (lambda x, i: torch.gather(x, 0, i) + 1, (torch.randn(5), ints(0, -1))),
    "index_select_out_of_range": (lambda x, i: x.index_select(0, i) * 2, (torch.randn(5, 3), ints(0, 5))),
    "index_select_negative": (lambda x, i: x.index_select(0, i) * 2, (torch.randn(5, 3), ints(-1, 2))),
    "getitem_out_of_range": (lambda x, i: x[i] * 2, (torch.randn(5), ints(0, 7))),
    "getitem_negative_wraps": (lambda x, i: x[i] * 2, (torch.randn(5), ints(0, -1, -5))),
    "getitem_negative_out_of_range": (lambda x, i: x[i] * 2, (torch.randn(5), ints(0, -6))),
    "getitem_second_dim": (lambda x, i: x[:, i] * 2, (torch.randn(4, 3), ints(1, 3))),
    "getitem_two_indices": (lambda x, i, j: x[i, j] * 2, (torch.randn(4, 3), ints(1, 3), ints(0, 2))),
    "take_out_of_range": (lambda x, i: torch.take(x, i) * 2, (torch.randn(4, 3), ints(0, 12))),
    "embedding_out_of_range": (lambda w, i: F.embedding(i, w) * 2, (torch.randn(5, 3), ints(0, 7))),
    "embedding_negative": (lambda w, i: F.embedding(i, w) * 2, (torch.randn(5, 3), ints(0, -1))),
    "embedding_valid": (lambda w, i: F.embedding(i, w) * 2, (torch.randn(5, 3), ints(4, 0, 2))),
    # indices out of range: scatter-style stores
    "scatter_row_out_of_range": (scatter_row, (torch.randn(3), ints(0, 5))),
    "scatter_row_negative": (scatter_row, (torch.randn(3), ints(0, -1))),
    "scatter_out_of_range": (lambda x, i: x.scatter(0, i[:, None].expand(-1, 3), 1.0) * 2,
                             (torch.randn(5, 3), ints(0, 7))),
    "index_add_out_of_range": (lambda x, i: x.index_add(0, i, torch.ones(2, 3)) * 2, (torch.randn(5, 3), ints(0, 7))),
    "index_add_negative": (lambda x, i: x.index_add(0, i, torch.ones(2, 3)) * 2, (torch.randn(5, 3), ints(0, -1))),
    "index_copy_negative": (lambda x, i: x.index_copy(0, i, torch.ones(2, 3)) * 2, (torch.randn(5, 3), ints(0, -1))),
    "index_fill_negative_wraps": (lambda x, i: x.index_fill(0, i, 2.0) * 2, (torch.randn(5, 3), ints(0, -1))),
    "index_put_out_of_range": (lambda x, i: x.index_put((i,), torch.ones(3)) * 2, (torch.randn(5, 3), ints(0, 7))),
    "setitem_out_of_range": (lambda x, i: put(x, i) * 2, (torch.randn(5, 3), ints(0, 7))),
    "setitem_negative_wraps": (lambda x, i: put(x, i) * 2, (torch.randn(5, 3), ints(0, -1))),
}


def outcome(fn, inputs):
    """('raises', exception type) or ('returns', outputs as a tuple)."""
    try:
        out = fn(*inputs)
    except Exception as e:  # noqa: BLE001  (the type is what is compared)
        return "raises", type(e), str(e)
    return "returns", out if isinstance(out, tuple) else (out,), None


def assert_same_outcome(got, ref):
    assert got[0] == ref[0], f"eager {ref[0]} {ref[1]}, kiln {got[0]} {got[1]}"
    if ref[0] == "raises":
        assert issubclass(got[1], ref[1]), f"eager raised {ref[1].__name__}: {ref[2]}; kiln {got[1].__name__}: {got[2]}"
        assert got[2], "an exception without a message"
        return
    for g, r in zip(got[1], ref[1], strict=True):
        assert g.dtype == r.dtype
        torch.testing.assert_close(g, r, rtol=0, atol=0, equal_nan=True)
        # signed zeros: -0.0 and 0.0 compare equal; their sign bits must match too
        if r.dtype.is_floating_point:
            assert torch.equal(torch.signbit(g), torch.signbit(r)), (g, r)


@pytest.mark.parametrize("name", list(CASES))
def test_kiln_matches_eager_on_edge_values(name):
    fn, inputs = CASES[name]
    kiln.reset()
    ref = outcome(fn, inputs)
    assert_same_outcome(outcome(kiln.compile(fn), inputs), ref)


def test_a_call_after_an_error_runs_normally():
    kiln.reset()
    compiled = kiln.compile(lambda x, i: x[i] * 2 + x.sum())
    x = torch.randn(5)
    with pytest.raises(IndexError):
        compiled(x, ints(0, 9))
    torch.testing.assert_close(compiled(x, ints(4, -2)), x[ints(4, -2)] * 2 + x.sum())
    with pytest.raises(IndexError):
        compiled(x, ints(-9, 1))


def test_int_min_truncating_division_by_minus_one_wraps():
    """Eager's own CPU kernel traps (SIGFPE kills the process) on this one; kiln returns the wrapped quotient
    that floor division gives."""
    kiln.reset()
    out = kiln.compile(lambda a, b: torch.div(a, b, rounding_mode="trunc") + 0)(ints(I64_MIN, 7), ints(-1, -1))
    assert out.tolist() == [I64_MIN, -7]


def test_errors_from_parallel_kernels():
    """Big enough for the C++ kernel's loops to run on several threads: one bad index among many."""
    kiln.reset()
    table = torch.randn(1000, 64)
    ids = torch.randint(0, 1000, (512,))
    compiled = kiln.compile(lambda w, i: F.embedding(i, w).relu())
    torch.testing.assert_close(compiled(table, ids), F.embedding(ids, table).relu())
    ids[300] = 1000
    with pytest.raises(IndexError, match="index out of range"):
        compiled(table, ids)


@pytest.mark.parametrize("row, column", [(0, 0), (37, 133), (63, 255)])
def test_one_bad_index_in_a_vectorized_loop(row, column):
    """The index varies along the innermost (SIMD) loop: the lane that holds the bad one still reports it."""
    kiln.reset()
    x = torch.randn(64, 256)
    index = torch.randint(0, 256, (64, 256))
    compiled = kiln.compile(lambda x, i: torch.gather(x, 1, i) * 2)
    torch.testing.assert_close(compiled(x, index), torch.gather(x, 1, index) * 2)
    index[row, column] = 256
    with pytest.raises(RuntimeError, match="out of bounds"):
        compiled(x, index)


TRITON_CASES = ["floordiv_by_zero", "remainder_by_zero", "division_valid", "int64_min_by_minus_one", "sign_sgn",
                "int_pow_overflow", "int_min_abs_neg", "integer_rounding_is_identity", "clamp_nan",
                "float_floordiv", "float_floordiv_rounding", "maximum_minimum_nan", "gather_out_of_range",
                "index_select_negative", "getitem_out_of_range", "getitem_negative_wraps", "embedding_out_of_range",
                "embedding_valid", "scatter_row_out_of_range"]


@pytest.mark.parametrize("name", TRITON_CASES)
def test_triton_matches_eager_on_edge_values(name):
    """The Triton target on CPU tensors (the interpreter): eager's CPU semantics, division checks included."""
    skip_unless_kernels_run()
    if DEVICE != "cpu":
        pytest.skip("eager's CUDA kernels do not check integer division; these cases compare with eager on CPU")
    fn, inputs = CASES[name]
    compiled = compile_aten_graph(trace(fn, *inputs, mode="fake"), list(inputs), {"cpu_backend": "triton"})
    assert "fallback" not in compiled.artefacts, compiled.artefacts["fallback"]
    assert_same_outcome(outcome(compiled, inputs), outcome(fn, inputs))
