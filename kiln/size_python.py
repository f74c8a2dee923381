"""Symbolic size expressions printed as Python, and the names that Python reads.

Capture's output program, the AOT stage's output rebuilds and the wrapper all turn sizes into Python lines run
per call. torch's sympy printer writes a size computed through floats (`math.ceil(math.sqrt(n))` of a dynamic
`n`) as `math.ceil(torch._sym_sqrt(torch.sym_float(s0)))`: any code running such a line needs `math` and
`torch` (and `max`/`min` for Max/Min) in its namespace, or it raises NameError on every call.
"""
from __future__ import annotations

import math

import sympy
import torch
from torch.utils._sympy.printers import PythonPrinter

# what printed size expressions read besides their symbols
SIZE_NAMES = {"math": math, "torch": torch, "max": max, "min": min}


def size_source(expr: sympy.Expr) -> str:
    """`expr` as a Python expression over its symbols' names (run it with `SIZE_NAMES` in scope)."""
    return PythonPrinter().doprint(expr)
