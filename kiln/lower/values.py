"""What an FX value is during lowering: a tensor as an index function.

A `IndexFunction` is a size, a dtype and a body: an IR expression over the index
symbols i0..i{n-1} giving its element at that index. Pointwise ops build new
bodies, views rewrite the index symbols, and a realized buffer is just a body
that loads from it. Nothing here is a closure, so every value is printable.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import affine_strides, index_vars, linear_index, simplify

# A gather (a load at a computed index) whose body is bigger than this is not trivial: each user that
# recomputes it computes its index again. An embedding's row lookup is about 10; T5's position bias, a
# logarithm of the query-key distance picking the table's bucket, about 80: recomputed in every layer's
# softmax at every element of every batch, it made those kernels four times as slow as reading the bias.
GATHER_INDEX_SIZE = 32


class Unsupported(Exception):
    """Raised by a lowering that cannot handle its arguments: the op runs as an extern instead."""


@dataclass(frozen=True)
class IndexFunction:
    size: tuple
    dtype: torch.dtype
    body: ir.Expr

    @property
    def ndim(self) -> int:
        return len(self.size)

    def at(self, index) -> ir.Expr:
        """The element expression at `index` (sympy expressions, one per dim)."""
        mapping = {v: sympy.sympify(i) for v, i in zip(index_vars("i", self.ndim), index)}
        if all(mapping[k] == k for k in mapping):
            return self.body
        return _simplify_loads(ir.subs_expr(self.body, mapping))

    def buffer_view(self):
        """(buf, offset, strides) if this value is a plain strided view of one buffer, else None."""
        return self._buffer_view

    @functools.cached_property
    def _buffer_view(self):
        """`buffer_view()`, found once per value: lowering asks it of every input of every op it inlines."""
        b = self.body
        if not isinstance(b, ir.Load) or b.mask is not None or b.indirect:
            return None
        aff = affine_strides(b.index, index_vars("i", self.ndim))
        if aff is None:
            return None
        offset, strides = aff
        if any(_reversed(sympy.sympify(st)) for st in strides):
            return None  # a reversed read (flip): torch's views have no negative strides, so it is computed
        return b.buf, offset, strides

    def is_trivial(self) -> bool:
        """True for loads, constants and index values: cheap to recompute at every use. Not a gather whose
        index takes more than a few ops to compute (see GATHER_INDEX_SIZE)."""
        if isinstance(self.body, ir.Load):
            return ir.expr_size(self.body) <= GATHER_INDEX_SIZE
        return not isinstance(self.body, ir.Op) or (self.body.name == "cast"
                                                    and not isinstance(self.body.args[0], ir.Op))


def _reversed(stride: sympy.Expr) -> bool:
    """Whether a load's stride walks backwards. A reversed read's coefficient is negative (-1, -s0); a stride
    over sizes is a product of sizes, even where a factor is an int input's symbol whose sign sympy cannot
    know (`groups` under dynamic=True: a channel count s0*s1): an unknown sign is taken as negative only where
    the expression reads as one (`2 - s0`)."""
    return stride.is_negative is True or (stride.is_nonnegative is not True and stride.could_extract_minus_sign())


def from_buffer(name: str, layout: ir.Layout) -> IndexFunction:
    idx = index_vars("i", len(layout.size))
    load = ir.Load(name, linear_index(idx, layout.stride, layout.offset), layout.dtype)
    value = IndexFunction(tuple(layout.size), layout.dtype, load)
    # The view is the layout itself: recovering it from the load's index may fail on symbolic strides whose sign
    # sympy cannot prove, and a buffer just made must always be usable as an extern's argument.
    value.__dict__["_buffer_view"] = (name, layout.offset, tuple(layout.stride))
    return value


def _simplify_loads(e: ir.Expr) -> ir.Expr:
    if isinstance(e, ir.Load):
        return ir.Load(e.buf, simplify(e.index), e.dtype, e.mask,
                       tuple((s, _simplify_loads(x)) for s, x in e.indirect))
    if isinstance(e, ir.Op):
        return ir.Op(e.name, tuple(_simplify_loads(a) for a in e.args), e.dtype)
    return e



@dataclass(frozen=True)
class SizeScalar(IndexFunction):
    """A Python float the graph computes from its symbolic sizes (kiln/lower/sym_floats.py), read by the ops
    that take it as a 0-d float64 value; it promotes as the Python scalar it stands for (`promote`)."""


def cast(e: ir.Expr, dtype: torch.dtype) -> ir.Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, ir.Const):  # folded to the value eager's conversion gives
        return ir.Const(ir.converted(e.value, e.dtype, dtype), dtype)
    return ir.Op("cast", (e,), dtype)


def _py_value(v, dtype):
    """`v` as a constant of `dtype` holds it: an integer wrapped into its range, as eager converts a Python int
    operand (`int32 + (1 << 40)` adds 0), so that no printer meets a literal its type cannot hold."""
    if dtype == torch.bool:
        return bool(v)
    if dtype.is_floating_point:
        return float(v)
    info = torch.iinfo(dtype)
    return (int(v) - info.min) % (1 << info.bits) + info.min


def const(value, dtype) -> ir.Const:
    return ir.Const(_py_value(value, dtype), dtype)
