"""Symbolic sizes: an int (or float, bool) that depends on the size of a dynamic dimension.

`x.shape[0]` of an input whose first dimension is dynamic is not a constant but
a SymInt carried by the fake tensor; arithmetic on it stays symbolic and
becomes graph nodes, so one graph serves every size. Where Python needs the
actual value (a `range()`, a branch), the value is specialized and the shape
environment records the guard that makes that safe.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue

SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


class SymValue(Value):
    def __init__(self, node: fx.Node, sym):
        self.node, self.sym = node, sym

    @property
    def fake(self):
        return self.sym

    def python_type(self) -> type:
        return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(self.sym)]

    def as_constant(self):
        """Specialize: the value of this call, guarded (the shape environment records the guard)."""
        return self.python_type()(self.sym)

    def truth(self, state) -> bool:
        return bool(self.sym)

    def getattr(self, state, name: str) -> Value:
        """An attribute of the number (`n.bit_length()`, `n.real`): of its value, specialized (guarded)."""
        return ConstantValue(self.as_constant()).getattr(state, name)

    def reconstruct(self, writer) -> str:
        return writer.symbolic(self.sym)

    def __repr__(self) -> str:
        return f"Sym({self.sym})"


def is_symbolic(value) -> bool:
    return isinstance(value, SYM_TYPES) and not value.node.expr.is_number
