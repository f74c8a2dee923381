"""Accumulating scatters (scatter_add, scatter_reduce, index_add, index_reduce, index_put with accumulate)
as dense reductions.

Each output element reduces, over every source position along the scattered dim, the source values whose
index names it: `out[..., j, ...] = reduce(x[..., j, ...], src[..., r, ...] for r where index(r) == j)`. No
element is written twice and nothing is atomic, so the result is deterministic and the reduction fuses with
what reads the sources (autograd's `scatter_add` into zeros for `gather`, `take_along_dim`, `index_select`).
The work is the output's size times the index's length along the dim: up to DENSE_LIMIT compares, larger
scatters stay ATen's (a sorted or atomic scatter beats a dense one there). Under symbolic sizes the bound is
decided at the sizes being compiled and kept as a size guard. An index outside the dim makes
the kernel report the error eager raises (`check_index`), so no bad index is dropped silently.
"""
from __future__ import annotations

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import FloorDiv, Mod, contiguous_strides, index_vars, product
from kiln.lower.ops.common import broadcast, broadcast_sizes, out_info, scalar_operand
from kiln.lower.ops.indexing import ADVANCED_INDEXING, GATHER, INDEX_SELECT, _safe_index, scatter_value
from kiln.lower.ops.reductions import reduce
from kiln.lower.ops.registry import register
from kiln.lower.values import IndexFunction, Unsupported, cast, const

aten = torch.ops.aten

DENSE_LIMIT = 1 << 20  # output elements x index length: the compares a dense scatter may cost

# scatter_reduce's / index_reduce's name -> (kiln reduction, identity of the reduction for a dtype)
REDUCES = {
    "sum": ("sum", lambda dtype: 0), "add": ("sum", lambda dtype: 0), "mean": ("sum", lambda dtype: 0),
    "prod": ("prod", lambda dtype: 1),
    "amax": ("max", lambda dtype: -float("inf") if dtype.is_floating_point else torch.iinfo(dtype).min),
    "amin": ("min", lambda dtype: float("inf") if dtype.is_floating_point else torch.iinfo(dtype).max),
}


def dense_fits(ctx, size, length) -> bool:
    """Whether a dense reduction over `length` source positions for each element of `size` costs at most
    DENSE_LIMIT compares. Sizes may be symbols (a dynamic graph): where the guards leave the bound open, it is
    decided at the sizes being compiled and guarded (`GraphLowering.decide`), so the dense kernel never runs
    over the limit and a graph that grows past it compiles again with the op as an ATen call."""
    return ctx.decide(sympy.Le(product(size) * length, DENSE_LIMIT)) is True


def _accumulator(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _dense(ctx, x: IndexFunction, size, dtype, dim: int, length, matches, value, reduction: str,
           include_self: bool) -> IndexFunction:
    """`x` with each element reduced (`reduction`, a key of REDUCES) with the values `value(r)` for which
    `matches(r)` holds, r over `length` source positions; both are IR expressions over the output's index
    vars i0.. and r (the var i{n})."""
    if dtype == torch.bool or not dense_fits(ctx, size, length):
        raise Unsupported("a scatter too large (or of bool) for a dense reduction")
    n = len(size)
    r = index_vars("i", n + 1)[n]
    rtype, identity = REDUCES[reduction]
    acc = _accumulator(dtype)
    hit = matches(r)
    picked = ir.Op("where", (hit, cast(value(r), acc), const(identity(dtype), acc)), acc)
    total = reduce(ctx, IndexFunction(tuple(size) + (length,), acc, picked), [n], False, rtype, acc)
    mine = cast(x.body, acc)
    count = None
    if reduction == "mean" or not include_self:
        count = reduce(ctx, IndexFunction(tuple(size) + (length,), torch.int64, cast(hit, torch.int64)), [n], False,
                       "sum", torch.int64).body
    if reduction == "mean":
        if include_self:
            total = IndexFunction(size, acc, ir.Op("add", (total.body, mine), acc))
        divisor = ir.Op("add", (count, const(int(include_self), torch.int64)), torch.int64)
        divisor = ir.Op("maximum", (divisor, const(1, torch.int64)), torch.int64)
        body = ir.Op("truediv" if acc.is_floating_point else "floordiv", (total.body, cast(divisor, acc)), acc)
    elif include_self:
        body = ir.Op({"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}[rtype],
                     (mine, total.body), acc)
    else:
        body = total.body
    if count is not None and not (reduction == "mean" and include_self):  # nothing scattered here: x as it is
        body = ir.Op("where", (ir.Op("gt", (count, const(0, torch.int64)), torch.bool), body, mine), acc)
    return IndexFunction(size, dtype, cast(body, dtype))


def _scatter_positions(x, index, src, dim, size):
    """(matches, value) of a scatter along `dim`: source position q is the output's index with dim `dim`
    replaced by r, inside the index's extent in every other dim (the index may be smaller than x). A 0-dim
    tensor is its one element, at position 0 of a dim of 1."""
    n = len(size)
    out_vars = index_vars("i", n)
    inside = sympy.And(*[sympy.Lt(out_vars[k], index.size[k]) for k in range(n)
                         if k != dim and index.size[k] != size[k]])

    def q(r):
        return [r if k == dim else out_vars[k] for k in range(n)]

    def matches(r):
        position = _safe_index(ir.add_mask(index.at(q(r)), inside), size[dim] if n else 1, GATHER)
        hit = ir.Op("eq", (position, ir.IndexValue(out_vars[dim] if n else sympy.Integer(0), torch.int64)),
                    torch.bool)
        return hit if inside == sympy.true else ir.Op("logical_and", (ir.IndexValue(inside, torch.bool), hit),
                                                      torch.bool)

    return matches, lambda r: ir.add_mask(src.at(q(r)), inside)


def _scatter(ctx, meta, x, dim, index, src, reduction, include_self=True):
    size, dtype = out_info(meta)
    if index.ndim != x.ndim or not isinstance(src, IndexFunction) or src.ndim != x.ndim:
        raise Unsupported("a scatter of a scalar source")
    dim = dim + x.ndim if dim < 0 else dim
    matches, value = _scatter_positions(x, index, src, dim, size)
    length = index.size[dim] if x.ndim else sympy.Integer(1)
    return _dense(ctx, x, size, dtype, dim, length, matches, value, reduction, include_self)


@register(aten.scatter_add.default)
def scatter_add(ctx, meta, x, dim, index, src):
    return _scatter(ctx, meta, x, dim, index, src, "sum")


@register(aten.scatter_reduce.two)
def scatter_reduce(ctx, meta, x, dim, index, src, reduce, *, include_self=True):
    return _scatter(ctx, meta, x, dim, index, src, reduce, include_self)


def _index_reduce(ctx, meta, x, dim, index, source, reduction, include_self, rule, alpha=1):
    """index_add / index_reduce: source's slice r along `dim` goes to slice index[r] of x."""
    size, dtype = out_info(meta)
    if index.ndim > 1:
        raise Unsupported("index_add / index_reduce with a multi-dim index")
    dim = dim + x.ndim if dim < 0 else dim
    out_vars = index_vars("i", x.ndim)
    length = index.size[0] if index.ndim else sympy.Integer(1)
    here = out_vars[dim] if x.ndim else sympy.Integer(0)  # a 0-dim tensor: its element, in a dim of 1

    def matches(r):
        position = _safe_index(index.at([r] if index.ndim else []), size[dim] if x.ndim else 1, rule)
        return ir.Op("eq", (position, ir.IndexValue(here, torch.int64)), torch.bool)

    def value(r):
        same_rank = source.ndim == x.ndim and x.ndim
        v = source.at([r if k == dim else out_vars[k] for k in range(x.ndim)] if same_rank else [r] * source.ndim)
        return v if alpha == 1 else ir.Op("mul", (v, scalar_operand(alpha, source.dtype)), source.dtype)

    return _dense(ctx, x, size, dtype, dim, length, matches, value, reduction, include_self)


@register(aten.index_add.default)
def index_add(ctx, meta, x, dim, index, source, *, alpha=1):
    return _index_reduce(ctx, meta, x, dim, index, source, "sum", True, GATHER, alpha)


@register(aten.index_reduce.default)
def index_reduce(ctx, meta, x, dim, index, source, reduce, *, include_self=True):
    return _index_reduce(ctx, meta, x, dim, index, source, reduce, include_self, INDEX_SELECT)


def _unravel(r, size) -> list:
    """The index into a tensor of `size` whose row-major flat position is r."""
    return [FloorDiv(r, stride) if k == 0 else Mod(FloorDiv(r, stride), s)
            for k, (s, stride) in enumerate(zip(size, contiguous_strides(size)))]


@register(aten.index_put.default)
def index_put(ctx, meta, x, indices, values, accumulate=False):
    """`x[indices] += values` (accumulate): autograd's gradient of advanced indexing `x[i]`. The index tensors
    broadcast to one shape B; each output element sums the values at the positions q of B whose indices
    name it (negative indices wrap, as indexing's do). Writes without accumulating pick one of several
    values written to one place (eager's order), so they stay ATen's."""
    size, dtype = out_info(meta)
    indices = list(indices) + [None] * (x.ndim - len(indices))
    present = [k for k, t in enumerate(indices) if t is not None]
    if not accumulate or not present or any(indices[k].dtype in (torch.bool, torch.uint8) for k in present):
        raise Unsupported("index_put without accumulate, or with a boolean mask")
    bsize = broadcast_sizes(*[indices[k].size for k in present])
    adjacent = present == list(range(present[0], present[-1] + 1))
    start = present[0] if adjacent else 0
    rest = [k for k in range(x.ndim) if k not in present]
    vsize = list(size[k] for k in rest)
    vsize[start:start] = bsize  # the shape of x[indices], which values broadcast to
    spread = IndexFunction(tuple(vsize), values.dtype, broadcast(values, tuple(vsize)))
    out_vars = index_vars("i", x.ndim)

    def q(r):
        return _unravel(r, bsize) if bsize else []

    def matches(r):
        hits = []
        for k in present:
            spread_index = IndexFunction(bsize, indices[k].dtype, broadcast(indices[k], bsize))
            position = _safe_index(spread_index.at(q(r)), size[k], ADVANCED_INDEXING)
            hits.append(ir.Op("eq", (position, ir.IndexValue(out_vars[k], torch.int64)), torch.bool))
        hit = hits[0]
        for h in hits[1:]:
            hit = ir.Op("logical_and", (hit, h), torch.bool)
        return hit

    def value(r):
        at = [out_vars[k] for k in rest]
        at[start:start] = q(r)
        return spread.at(at)

    return _dense(ctx, x, size, dtype, present[0], product(bsize), matches, value, "sum", True)


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(ctx, meta, x, dim, index, value):
    """`x` with the slices along `dim` that `index` names set to `value` (negative indices wrap, as eager's
    index_fill wraps them): a dense `any` over the index, then a select."""
    size, dtype = out_info(meta)
    if index.ndim > 1 or not dense_fits(ctx, size, index.size[0] if index.ndim else 1):
        raise Unsupported("index_fill with a multi-dim or long index")
    dim = dim + x.ndim if dim < 0 else dim
    n = x.ndim
    r = index_vars("i", n + 1)[n]
    here = index_vars("i", n)[dim] if n else sympy.Integer(0)
    length = index.size[0] if index.ndim else sympy.Integer(1)
    position = _safe_index(index.at([r] if index.ndim else []), size[dim] if n else 1, ADVANCED_INDEXING)
    hit = ir.Op("eq", (position, ir.IndexValue(here, torch.int64)), torch.bool)
    named = reduce(ctx, IndexFunction(tuple(size) + (length,), torch.bool, hit), [n], False, "any", torch.bool)
    fill = scalar_operand(value, dtype)
    return IndexFunction(size, dtype, ir.Op("where", (named.body, fill, cast(x.body, dtype)), dtype))


@register(aten.scatter.value)
def scatter_of_a_value(ctx, meta, x, dim, index, value):
    """`x` with `value` written wherever `index` points along `dim`. One position per row is a select
    (indexing.scatter_value); otherwise, since every write writes the same value, the order of writes to one
    place does not matter: a dense `any` over the index says which elements take the value."""
    try:
        return scatter_value(ctx, meta, x, dim, index, value)
    except Unsupported:
        pass
    size, dtype = out_info(meta)
    if index.ndim != x.ndim or dtype == torch.bool:
        raise Unsupported("a scatter of a value with an index of another rank")
    dim = dim + x.ndim if dim < 0 else dim
    length = index.size[dim] if x.ndim else sympy.Integer(1)
    if not dense_fits(ctx, size, length):
        raise Unsupported("a scatter too large for a dense reduction")
    matches, _ = _scatter_positions(x, index, x, dim, size)
    n = len(size)
    r = index_vars("i", n + 1)[n]
    named = reduce(ctx, IndexFunction(tuple(size) + (length,), torch.bool, matches(r)), [n], False, "any", torch.bool)
    body = ir.Op("where", (named.body, scalar_operand(value, dtype), cast(x.body, dtype)), dtype)
    return IndexFunction(size, dtype, body)
