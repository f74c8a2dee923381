"""The op table's half-precision cases on the Triton target, run on the CPU through Triton's interpreter.

Same ops and the same comparison with eager as test_op_table.py (which runs the C++ target); one small
shape per case, since the interpreter is slow. TRITON_INTERPRET=1 must be set before triton is imported;
on a GPU machine `KILN_TRITON_TEST_DEVICE=cuda` runs the kernels for real.
"""
from __future__ import annotations

import pytest
import torch

from support.triton_device import DEVICE, skip_module_unless_kernels_run

skip_module_unless_kernels_run()

from lower.test_op_table import FLOAT_BINARY, FLOAT_UNARY, REDUCTIONS  # noqa: E402
from support.lowering import check_triton  # noqa: E402

ROUNDING_TIES = ("round", "floor", "ceil", "trunc", "to_int", "to_bool", "sign", "floordiv", "truncdiv", "remainder",
                 "round_decimals", "round_decimals_neg",
                 "prod", "argmax", "argmin0", "argmax_all", "max_dim")


def check(fn, *inputs):
    return check_triton(fn, *inputs)


@pytest.mark.parametrize("dtype", [torch.float16], ids=str)
def test_pointwise_half(dtype):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 5, generator=g).to(dtype), torch.randn(5, generator=g).to(dtype)
    unary = [f for k, f in FLOAT_UNARY.items() if k not in ROUNDING_TIES]
    binary = [f for k, f in FLOAT_BINARY.items() if k not in ROUNDING_TIES]
    c = check(lambda a, b: tuple(f(a) for f in unary) + tuple(f(a, b) for f in binary), a, b)
    assert "tl.float16" in c.artefacts["kernels.py"]


@pytest.mark.parametrize("dtype", [torch.float16], ids=str)
def test_reductions_half(dtype):
    a = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
    cases = [f for k, f in REDUCTIONS.items() if k not in ROUNDING_TIES]
    check(lambda a: tuple(f(a) for f in cases), a)


def test_half_casts_round_like_eager():
    x = torch.tensor([0.0, 1.0, -2.5, 70000.0, 65519.0, 65520.0, 1e-7, 3e-8, 1 + 2 ** -11, 1 + 3 * 2 ** -11,
                      float("inf"), float("nan")])
    c = check(lambda x: (x.to(torch.float16), x.to(torch.float16).float() * 2), x)
    torch.testing.assert_close(c(x.to(DEVICE))[0], x.to(DEVICE).half(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.filterwarnings("ignore:index_reduce")
@pytest.mark.skipif(DEVICE != "cpu", reason="the cases build their index tensors on the CPU (eager rejects them "
                                             "beside CUDA tensors); the interpreter runs them")
def test_scatters_and_scans():
    """The dense scatters and scans (tests/lower/test_scatters.py) as Triton kernels, their index checks included."""
    from lower.test_scatters import SCATTERS, SOURCE, SRC, X

    check(lambda x, src, source: tuple(f(x, src, source) for f in SCATTERS.values()), X, SRC, SOURCE)
