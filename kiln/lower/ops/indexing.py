"""Gather-style lowerings: loads whose index is read from another tensor.

The source tensor is realized (it is addressed in memory) and read through a
`Load` whose index names symbols `ind<k>`, each bound to an integer expression
over the index tensors (`Load.indirect`). Each index goes through `check_index`:
an index eager would reject makes the kernel report the op's error (raised by the
wrapper, as eager raises it) and reads a valid address instead, so a bad index
never reads outside the buffer. Negative indices wrap only where eager wraps them
(advanced indexing); gather, index_select and embedding reject them.
"""
from __future__ import annotations

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import FloorDiv, Mod, index_vars, linear_index
from kiln.lower.ops.common import broadcast, out_info, scalar_operand
from kiln.lower.ops.registry import register
from kiln.lower.values import IndexFunction, Unsupported, cast, const

aten = torch.ops.aten


# How each op reads an index: (the error eager raises for one out of range, whether negatives wrap).
ADVANCED_INDEXING = (ir.INDEX_OUT_OF_BOUNDS, True)
INDEX_SELECT = (ir.INDEX_OUT_OF_RANGE, False)
GATHER = (ir.GATHER_OUT_OF_BOUNDS, False)


def _safe_index(e: ir.Expr, size, rule: tuple) -> ir.Expr:
    """`e` as an int64 index into a dim of `size`, checked as the op (`rule`) checks it."""
    error, wraps = rule
    size = sympy.sympify(size)
    if size == 0:
        raise Unsupported("an index into an empty dim")  # eager raises for any index; ATen says which
    e = cast(e, torch.int64)
    n = ir.IndexValue(size, torch.int64)
    if wraps:
        e = ir.Op("where", (ir.Op("lt", (e, const(0, torch.int64)), torch.bool), ir.Op("add", (e, n), torch.int64),
                            e), torch.int64)
    return ir.Op("check_index", (e, n, const(error, torch.int64)), torch.int64)


def _is_indirect(v) -> bool:
    return isinstance(v, (ir.Load, ir.Op, ir.Const, ir.IndexValue))


def static_position(e: ir.Expr, size) -> sympy.Expr | None:
    """An index computed from loop positions alone (no tensor read), as a sympy index, when it is provably in
    [0, size): then the gather is a plain load, with no range check. `torch.roll` is the case: its reference
    implementation reads `index_select(x, d, fmod(arange(n) + start, n))` with 0 <= start < n, an index kiln
    would otherwise compute per element and check (Swin's shifted windows read every activation so)."""
    position = _as_index(e)
    if position is None or not _nonnegative(position):
        return None
    size = sympy.sympify(size)  # a symbol where sizes are dynamic: then only what holds for any size counts
    if position.is_Integer:
        return position if (size - position - 1).is_nonnegative is True else None
    if isinstance(position, Mod) and position.args[1].is_Integer and (size - position.args[1]).is_nonnegative is True:
        return position
    return None


def _as_index(e: ir.Expr) -> sympy.Expr | None:
    """`e` (an integer IR expression) as a sympy index expression, or None (a load, a float, an op with no
    rule in INDEX_OPS, a division by something other than a positive constant, a dividend not provably >= 0)."""
    if isinstance(e, ir.IndexValue) and not e.dtype.is_floating_point and e.dtype != torch.bool:
        return sympy.sympify(e.expr)
    if isinstance(e, ir.Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return sympy.Integer(e.value)
    if not isinstance(e, ir.Op) or e.name not in INDEX_OPS or e.dtype not in (torch.int32, torch.int64):
        return None  # a float, a bool, or a narrow integer that could wrap
    args = [_as_index(a) for a in e.args]
    if None in args:
        return None
    return INDEX_OPS[e.name](*args)


def _divided(kind):
    """A division of a non-negative dividend by a positive constant (where C's and Python's rounding agree)."""
    def rule(a, b):
        return kind(a, b) if b.is_Integer and b > 0 and _nonnegative(a) else None
    return rule


# Integer ops an index computed from loop positions is made of, as sympy index expressions.
INDEX_OPS = {
    "add": lambda a, b: a + b, "mul": lambda a, b: a * b, "cast": lambda a: a,
    "fmod": _divided(Mod), "mod": _divided(Mod), "floordiv": _divided(FloorDiv), "truncdiv": _divided(FloorDiv),
}


def _nonnegative(e) -> bool:
    """Whether index expression `e` is >= 0 by its form: non-negative constants and loop variables combined by
    sums, products, FloorDiv and Mod."""
    if e is None:
        return False
    if e.is_Integer or e.is_Symbol:
        return bool(e.is_nonnegative)
    if isinstance(e, (sympy.Add, sympy.Mul, FloorDiv, Mod)):
        return all(_nonnegative(a) for a in e.args)
    return False


def gather_load(ctx, x: IndexFunction, idx: list, rule: tuple) -> ir.Expr:
    """`x` at `idx`, where each entry is a sympy index or an IR expression (an indirect index) checked by
    `rule` (ADVANCED_INDEXING, INDEX_SELECT or GATHER)."""
    if x.buffer_view() is None:
        inlined = _inline_gather(x, idx, rule)
        if inlined is not None:
            return inlined
    x = ctx.realize(x)
    buf, offset, strides = x.buffer_view()
    binds, parts = [], []
    idx = _static_positions(idx, x.size)
    for k, v in enumerate(idx):
        if _is_indirect(v):
            sym = sympy.Symbol(f"ind{len(binds)}", integer=True)
            binds.append((sym, _safe_index(v, x.size[k], rule)))
            parts.append(sym)
        else:
            parts.append(v)
    return ir.Load(buf, linear_index(parts, strides, offset), x.dtype, None, tuple(binds))


def _static_positions(idx: list, sizes) -> list:
    """`idx` with each indirect entry that `static_position` proves in range replaced by its sympy index."""
    out = []
    for v, n in zip(idx, sizes):
        position = static_position(v, n) if _is_indirect(v) else None
        out.append(v if position is None else position)
    return out


def _inline_gather(x: IndexFunction, idx: list, rule: tuple) -> ir.Expr | None:
    """`x`'s (unrealized) body evaluated at `idx` without writing `x` to memory, or None.

    Cross-entropy gathers one element per row of `log_softmax(logits)`: realizing it writes a
    [tokens, vocabulary] fp32 tensor (gigabytes for a language model) to read one value a row back. Evaluating
    the body at the gathered positions reads a few elements instead. This works when the
    indirect positions only reach the indices of the body's loads, where `Load.indirect` can
    bind them; a mask or an index value over them (padding, iota) falls back to realizing.
    """
    taken = {str(s) for ld in ir.loads(x.body) for s, _ in ld.indirect}
    fresh = (f"ind{k}" for k in range(len(taken) + len(idx) + 1) if f"ind{k}" not in taken)
    binds, parts = {}, []
    idx = _static_positions(idx, x.size)
    for k, v in enumerate(idx):
        if _is_indirect(v):
            sym = sympy.Symbol(next(fresh), integer=True)
            binds[sym] = _safe_index(v, x.size[k], rule)
            parts.append(sym)
        else:
            parts.append(v)
    try:
        return _bind_indirect(x.at(parts), binds)
    except Unsupported:
        return None


def _bind_indirect(e: ir.Expr, binds: dict) -> ir.Expr:
    """`e` with each load whose index uses a symbol of `binds` binding it (Unsupported where a mask or an
    index value would need one)."""
    if isinstance(e, ir.Load):
        used = sympy.sympify(e.index).free_symbols & binds.keys()
        if e.mask is not None and sympy.sympify(e.mask).free_symbols & binds.keys():
            raise Unsupported("an indirect position in a load mask")
        indirect = tuple((s, _bind_indirect(v, binds)) for s, v in e.indirect)
        indirect += tuple((s, binds[s]) for s in sorted(used, key=str))
        return ir.Load(e.buf, e.index, e.dtype, e.mask, indirect)
    if isinstance(e, ir.IndexValue):
        if sympy.sympify(e.expr).free_symbols & binds.keys():
            raise Unsupported("an indirect position in an index value")
        return e
    if isinstance(e, ir.Op):
        return ir.Op(e.name, tuple(_bind_indirect(a, binds) for a in e.args), e.dtype)
    return e


@register(aten.embedding.default)
def embedding(ctx, meta, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    size, dtype = out_info(meta)
    out_vars = index_vars("i", len(size))
    row = indices.at(out_vars[:-1])
    return IndexFunction(size, dtype, gather_load(ctx, weight, [row, out_vars[-1]], INDEX_SELECT))


@register(aten.index_select.default)
def index_select(ctx, meta, x, dim, index):
    size, dtype = out_info(meta)
    dim = dim + x.ndim if dim < 0 else dim
    out_vars = list(index_vars("i", len(size)))
    idx = list(out_vars)
    if x.ndim:
        idx[dim] = index.at([out_vars[dim]] if index.ndim else [])
    return IndexFunction(size, dtype, gather_load(ctx, x, idx, INDEX_SELECT))


@register(aten.gather.default)
def gather(ctx, meta, x, dim, index, sparse_grad=False):
    size, dtype = out_info(meta)
    if x.ndim == 0:
        raise Unsupported("gather from a 0-dim tensor")
    dim = dim + x.ndim if dim < 0 else dim
    out_vars = list(index_vars("i", len(size)))
    idx = list(out_vars)
    idx[dim] = index.at(out_vars)
    return IndexFunction(size, dtype, gather_load(ctx, x, idx, GATHER))


def scatter_value(ctx, meta, x, dim, index, value):
    """`x` with `value` written at one position per row along `dim`: a pointwise select.

    Cross-entropy's backward scatters -1 into a zero [tokens, vocabulary] tensor; as an
    extern that fills, copies and scatters the whole tensor in fp32, as a select it
    fuses into its consumer. Only when `index` has one entry along `dim` and `x`'s extent
    elsewhere (so no position is written twice); other scatters of a value are dense (scatters.py).
    An index out of range raises, as eager's scatter does.
    """
    size, dtype = out_info(meta)
    dim = dim + x.ndim if dim < 0 else dim
    if index.ndim != x.ndim or index.size[dim] != 1 or any(
            index.size[d] != x.size[d] for d in range(x.ndim) if d != dim):
        raise Unsupported("scatter of more than one position per row")
    out_vars = list(index_vars("i", len(size)))
    row = list(out_vars)
    row[dim] = sympy.Integer(0)
    position = _safe_index(index.at(row), x.size[dim], GATHER)
    hit = ir.Op("eq", (position, ir.IndexValue(out_vars[dim], torch.int64)), torch.bool)
    body = ir.Op("where", (hit, scalar_operand(value, dtype), cast(x.at(out_vars), dtype)), dtype)
    return IndexFunction(size, dtype, body)


@register(aten.index.Tensor)
def index_tensor(ctx, meta, x, indices):
    """Advanced indexing `x[i0, :, i2]`: index tensors broadcast together; their dims go where the
    first one was if they are adjacent, else first (numpy rules)."""
    size, dtype = out_info(meta)
    indices = list(indices) + [None] * (x.ndim - len(indices))
    present = [k for k, t in enumerate(indices) if t is not None]
    if any(t.dtype in (torch.bool, torch.uint8) for t in indices if t is not None):
        raise Unsupported("boolean mask indexing")
    adjacent = present == list(range(present[0], present[-1] + 1))
    bdim = max(t.ndim for t in indices if t is not None)
    out_vars = list(index_vars("i", len(size)))
    start = present[0] if adjacent else 0
    bvars = out_vars[start:start + bdim]
    rest = iter(out_vars[:start] + out_vars[start + bdim:])
    bsize = tuple(size[start:start + bdim])
    idx = []
    for k in range(x.ndim):
        t = indices[k]
        if t is None:
            idx.append(next(rest))
        else:
            sub = IndexFunction(bsize, t.dtype, broadcast(t, bsize))
            idx.append(sub.at(bvars))
    return IndexFunction(size, dtype, gather_load(ctx, x, idx, ADVANCED_INDEXING))
