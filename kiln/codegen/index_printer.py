"""Printing sympy index and size expressions as C++ or Python source.

Shared by every code generator: the C++ kernels, the Python wrapper, and the
Triton kernels (which use the Python form).
"""
from __future__ import annotations

import sympy
from torch.utils._sympy import functions as torch_sympy

from kiln.lower.index import FLOOR_DIVISIONS, MAXIMA, MINIMA, REMAINDERS

# Sizes from FX metadata (symbolic shapes) carry torch's own sympy functions (FloorDiv, Mod, Max, Min,
# PowByNatural): on sizes, non-negative integers, they mean what kiln's and sympy's do and print the same.
# An int input made a symbol may be negative: a division or remainder over it (torch's FloorDiv and PythonMod
# round toward negative infinity, as Python does) prints as the target's floor division and Python remainder.


def _over_signed(e) -> bool:
    """Whether `e` reads a symbol that may be negative (an int input's; sizes and loop indices are not)."""
    return any(not s.is_nonnegative for s in e.free_symbols)


class _Printer:
    floordiv = "({} // {})"
    mod = "({} % {})"
    signed_floordiv = "({} // {})"  # Python's own operators round as torch's sympy functions do
    signed_mod = "({} % {})"
    land, lor, lnot = " and ", " or ", "not "
    true, false = "True", "False"

    def __call__(self, e) -> str:
        e = sympy.sympify(e)
        return self.p(e)

    def p(self, e) -> str:
        if e is sympy.true or e == sympy.true:
            return self.true
        if e is sympy.false or e == sympy.false:
            return self.false
        if e.is_Integer:
            return self.integer(int(e))
        if e.is_Symbol:
            return e.name
        if isinstance(e, FLOOR_DIVISIONS):
            form = self.signed_floordiv if _over_signed(e) else self.floordiv
            return form.format(self.p(e.args[0]), self.p(e.args[1]))
        if isinstance(e, REMAINDERS):
            form = self.signed_mod if _over_signed(e) else self.mod
            return form.format(self.p(e.args[0]), self.p(e.args[1]))
        if isinstance(e, sympy.Add):
            return "(" + " + ".join(self.p(a) for a in e.args) + ")"
        if isinstance(e, sympy.Mul):
            return "(" + "*".join(self.p(a) for a in e.args) + ")"
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return "(" + "*".join([self.p(e.base)] * int(e.exp)) + ")"
        if isinstance(e, sympy.And):
            return "(" + self.land.join(self.p(a) for a in e.args) + ")"
        if isinstance(e, sympy.Or):
            return "(" + self.lor.join(self.p(a) for a in e.args) + ")"
        if isinstance(e, sympy.Not):
            return "(" + self.lnot + self.p(e.args[0]) + ")"
        if isinstance(e, sympy.core.relational.Relational):
            return f"({self.p(e.lhs)} {e.rel_op} {self.p(e.rhs)})"
        if isinstance(e, MAXIMA + MINIMA):
            name = "max" if isinstance(e, MAXIMA) else "min"
            return self.minmax(name, [self.p(a) for a in e.args])
        if type(e) is torch_sympy.PowByNatural and e.args[1].is_Integer and int(e.args[1]) > 0:
            return "(" + "*".join([self.p(e.args[0])] * int(e.args[1])) + ")"
        raise NotImplementedError(f"cannot print index expression {e!r} ({type(e).__name__})")

    def integer(self, v: int) -> str:
        return str(v)

    def minmax(self, name, args) -> str:
        return f"{name}({', '.join(args)})"


class CPrinter(_Printer):
    """C++: integer division and modulo of non-negative int64 values."""

    floordiv = "({} / {})"
    signed_floordiv = "kiln::index_floordiv({}, {})"
    signed_mod = "kiln::index_mod({}, {})"
    land, lor, lnot = " && ", " || ", "!"
    true, false = "true", "false"

    def integer(self, v: int) -> str:
        return f"{v}L" if abs(v) > 2**31 - 1 else str(v)

    def minmax(self, name, args) -> str:
        out = args[0]
        for a in args[1:]:
            out = f"std::{name}<int64_t>({out}, {a})"
        return out


class PythonPrinter(_Printer):
    pass


cexpr = CPrinter()
pyexpr = PythonPrinter()
