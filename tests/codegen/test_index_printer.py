"""Index and size expressions print as C++ and Python, whichever sympy functions they carry: kiln's own, sympy's,
and torch's (symbolic sizes from FX metadata: `s0 // 2`, `Max(1, s0 - 1)`)."""
import pytest
import sympy
from torch.utils._sympy import functions as torch_sympy

from kiln.codegen.index_printer import CPrinter, PythonPrinter
from kiln.lower.index import FloorDiv

s = sympy.Symbol("s0", integer=True, positive=True)
CASES = [
    (torch_sympy.FloorDiv(s + 2, 3), "((2 + s0) / 3)", "((2 + s0) // 3)"),
    (FloorDiv(s + 2, 3), "((2 + s0) / 3)", "((2 + s0) // 3)"),
    (torch_sympy.Mod(s, 3), "(s0 % 3)", "(s0 % 3)"),
    (torch_sympy.Max(1, s - 1), "std::max<int64_t>(1, (-1 + s0))", "max(1, (-1 + s0))"),
    (sympy.Max(1, s - 1), "std::max<int64_t>(1, (-1 + s0))", "max(1, (-1 + s0))"),
    (torch_sympy.Min(4, s), "std::min<int64_t>(4, s0)", "min(4, s0)"),
    (torch_sympy.PowByNatural(s, 2), "(s0*s0)", "(s0*s0)"),
]


@pytest.mark.parametrize("expr, cpp, python", CASES,
                         ids=lambda c: type(c).__name__ if isinstance(c, sympy.Basic) else None)
def test_prints_as_cpp_and_python(expr, cpp, python):
    assert CPrinter()(expr) == cpp
    assert PythonPrinter()(expr) == python
    for size in (1, 5, 12):
        assert eval(python, {"max": max, "min": min, "s0": size}) == int(expr.subs(s, size))
