"""View and layout lowerings: index rewrites, no data movement.

Each rule returns a IndexFunction whose body is the input's body at a rewritten
index. `cat` and `constant_pad_nd` build masked selections: a load only happens
where its source covers the index (`ir.add_mask`).
"""
from __future__ import annotations

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import (
    FloorDiv,
    Mod,
    contiguous_strides,
    index_vars,
    linear_index,
    proper_factor,
    sympify,
    view_strides,
)
from kiln.lower.layout import padded
from kiln.lower.ops.common import out_info
from kiln.lower.ops.registry import register
from kiln.lower.values import IndexFunction, Unsupported, cast

aten = torch.ops.aten


def _dim(d, n):
    return d + n if d < 0 else d


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def reshape(ctx, meta, x, size):
    new_size, dtype = out_info(meta)
    return reshape_value(x, new_size)


def reshape_value(x: IndexFunction, new_size) -> IndexFunction:
    new_vars = index_vars("i", len(new_size))
    bv = x.buffer_view()
    if bv is not None:
        buf, offset, strides = bv
        st = view_strides(x.size, strides, new_size)
        if st is not None:
            return IndexFunction(tuple(new_size), x.dtype, ir.Load(buf, linear_index(new_vars, st, offset), x.dtype))
    if any(s == 0 for s in new_size):
        return IndexFunction(tuple(new_size), x.dtype, x.at([sympy.Integer(0)] * x.ndim))
    try:
        idx = _reshape_index(x.size, new_size)
    except IndexError:  # sizes whose products kiln cannot compare symbolically: go through the flat index
        flat = linear_index(new_vars, contiguous_strides(new_size))
        idx = [FloorDiv(flat, cs) if k == 0 else Mod(FloorDiv(flat, cs), s)
               for k, (s, cs) in enumerate(zip(x.size, contiguous_strides(x.size)))]
    return IndexFunction(tuple(new_size), x.dtype, x.at(idx))


def _reshape_index(old_size, new_size) -> list:
    """Old index as a function of the new one, group by group of dims with equal products.

    Splitting a dim is affine (i = 64*j0 + j1); only merged dims need // and %.
    """
    new_vars = index_vars("i", len(new_size))
    old_nz = [k for k, s in enumerate(old_size) if s != 1]
    new_nz = [k for k, s in enumerate(new_size) if s != 1]
    idx = [sympy.Integer(0)] * len(old_size)
    oi = ni = 0
    while oi < len(old_nz) or ni < len(new_nz):
        og, ng = [old_nz[oi]], [new_nz[ni]]
        po, pn = old_size[og[0]], new_size[ng[0]]
        oi, ni = oi + 1, ni + 1
        while po != pn:
            if proper_factor(pn, po):
                ng.append(new_nz[ni])
                pn, ni = pn * new_size[new_nz[ni]], ni + 1
            else:
                og.append(old_nz[oi])
                po, oi = po * old_size[old_nz[oi]], oi + 1
        flat = linear_index([new_vars[k] for k in ng], contiguous_strides([new_size[k] for k in ng]))
        strides = contiguous_strides([old_size[k] for k in og])
        for j, (k, st) in enumerate(zip(og, strides)):
            q = FloorDiv(flat, st)
            idx[k] = q if j == 0 else Mod(q, old_size[k])
    return idx


@register(aten.permute.default)
def permute(ctx, meta, x, dims):
    n = x.ndim
    dims = [_dim(d, n) for d in dims]
    out_vars = index_vars("i", n)
    idx = [None] * n
    for k, d in enumerate(dims):
        idx[d] = out_vars[k]
    return IndexFunction(tuple(x.size[d] for d in dims), x.dtype, x.at(idx))


@register(aten.expand.default)
def expand(ctx, meta, x, size, implicit=False):
    new_size, _ = out_info(meta)
    n, r = len(new_size), x.ndim
    out_vars = index_vars("i", n)
    idx = [sympy.Integer(0) if (x.size[k] == 1 and new_size[n - r + k] != 1) else out_vars[n - r + k]
           for k in range(r)]
    return IndexFunction(new_size, x.dtype, x.at(idx))


@register(aten.unsqueeze.default)
def unsqueeze(ctx, meta, x, dim):
    dim = _dim(dim, x.ndim + 1)
    out_vars = index_vars("i", x.ndim + 1)
    idx = [v for k, v in enumerate(out_vars) if k != dim]
    return IndexFunction(x.size[:dim] + (sympy.Integer(1),) + x.size[dim:], x.dtype, x.at(idx))


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(ctx, meta, x, dims=None):
    new_size, _ = out_info(meta)
    if dims is None:
        dims = [k for k, s in enumerate(x.size) if s == 1]
    elif isinstance(dims, int):
        dims = [dims]
    dims = {_dim(d, max(x.ndim, 1)) for d in dims if x.ndim and x.size[_dim(d, x.ndim)] == 1}
    out_vars = iter(index_vars("i", x.ndim - len(dims)))
    idx = [sympy.Integer(0) if k in dims else next(out_vars) for k in range(x.ndim)]
    return IndexFunction(tuple(s for k, s in enumerate(x.size) if k not in dims), x.dtype, x.at(idx))


def _from_end(ctx, index, size) -> sympy.Expr:
    """`index` as a position: `index + size` where it counts from the end (is negative). A symbolic index is a
    symbol of an int input (or an expression of one), which may have either sign where the guards leave it
    open: `size` is then added at run time, times 1 for a negative index and 0 otherwise (an integer
    expression of Max and Min, which kernels print), so one kernel serves both signs."""
    negative = ctx.known(sympy.Lt(index, 0))
    if negative is None:
        return index + size * (1 - sympy.Min(sympy.Max(index + 1, 0), 1))
    return index + size if negative else index


def _norm_start(ctx, start, size):
    """A slice's start as the position it reads from: from the end when negative, clamped to the dimension (to its
    first element where counting from the end passes it)."""
    start = _from_end(ctx, sympify(0 if start is None else start), size)
    before_first = ctx.known(sympy.Lt(start, 0))
    if before_first:
        start = sympy.Integer(0)
    elif before_first is None:
        start = sympy.Max(start, 0)
    if start.is_Integer and size.is_Integer:
        start = sympy.Integer(min(int(start), int(size)))
    return start


@register(aten.slice.Tensor)
def slice_(ctx, meta, x, dim=0, start=None, end=None, step=1):
    new_size, _ = out_info(meta)
    dim = _dim(dim, x.ndim)
    start = _norm_start(ctx, start, x.size[dim])
    out_vars = index_vars("i", x.ndim)
    idx = list(out_vars)
    idx[dim] = out_vars[dim] * step + start
    return IndexFunction(new_size, x.dtype, x.at(idx))


@register(aten.select.int)
def select(ctx, meta, x, dim, index):
    dim = _dim(dim, x.ndim)
    index = _from_end(ctx, sympify(index), x.size[dim])
    out_vars = index_vars("i", x.ndim - 1)
    idx = list(out_vars[:dim]) + [index] + list(out_vars[dim:])
    return IndexFunction(x.size[:dim] + x.size[dim + 1:], x.dtype, x.at(idx))


@register(aten.split_with_sizes.default, aten.split.Tensor)
def split(ctx, meta, x, sizes, dim=0):
    dim = _dim(dim, x.ndim)
    outs, start = [], sympy.Integer(0)
    for m in meta:
        size, _ = out_info(m)
        out_vars = index_vars("i", x.ndim)
        idx = list(out_vars)
        idx[dim] = out_vars[dim] + start
        outs.append(IndexFunction(size, x.dtype, x.at(idx)))
        start = start + size[dim]
    return outs


@register(aten.unbind.int)
def unbind(ctx, meta, x, dim=0):
    return [select(ctx, m, x, dim, k) for k, m in enumerate(meta)]


@register(aten.cat.default)
def cat(ctx, meta, tensors, dim=0):
    size, dtype = out_info(meta)
    dim = _dim(dim, len(size))
    parts = [t for t in tensors if not (t.ndim == 1 and t.size[0] == 0)]
    if not parts:  # every input a legacy empty 1-d tensor: so is the result, whose body is never read
        return IndexFunction(size, dtype, ir.Const(0, dtype))
    parts = [t for t in parts if t.size[dim] != 0] or parts[:1]
    out_vars = index_vars("i", len(size))
    v = out_vars[dim]
    starts, acc = [], sympy.Integer(0)
    for t in parts:
        starts.append(acc)
        acc = acc + t.size[dim]
    body = None
    for t, start in reversed(list(zip(parts, starts))):
        idx = list(out_vars)
        idx[dim] = v - start
        piece = cast(t.at(idx), dtype)
        if body is None:
            body = ir.add_mask(piece, sympy.Ge(v, start)) if start != 0 else piece
            continue
        cond = sympy.Lt(v, start + t.size[dim])
        lo = sympy.Ge(v, start) if start != 0 else sympy.true
        body = ir.Op("where", (ir.IndexValue(cond, torch.bool), ir.add_mask(piece, sympy.And(lo, cond)), body), dtype)
    return IndexFunction(size, dtype, body)


@register(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, meta, x, pad, value=0):
    size, dtype = out_info(meta)
    return padded(x, pad, size, dtype, value)


@register(aten.diagonal.default)
def diagonal(ctx, meta, x, offset=0, dim1=0, dim2=1):
    """The diagonal of dims `dim1`, `dim2` (above it for `offset` > 0) as the last dim of the result."""
    new_size, _ = out_info(meta)
    dim1, dim2 = _dim(dim1, x.ndim), _dim(dim2, x.ndim)
    out_vars = index_vars("i", len(new_size))
    rest, k = iter(out_vars[:-1]), out_vars[-1]
    idx = [None if d in (dim1, dim2) else next(rest) for d in range(x.ndim)]
    idx[dim1] = k + max(-offset, 0)
    idx[dim2] = k + max(offset, 0)
    return IndexFunction(new_size, x.dtype, x.at(idx))


@register(aten.as_strided.default)
def as_strided(ctx, meta, x, size, stride, storage_offset=None):
    """`x`'s storage read at `storage_offset + sum(i * stride)`, where that storage is `x` alone, laid out
    contiguously: a tensor the graph computed, no view, as eager's meta value shows it (torch's CPU group norm
    reshapes its `.contiguous()` statistics so). The storage of a graph input or of a view holds more than the
    tensor, which only ATen knows at run time: those stay externs."""
    source = ctx.current_argument(0)
    eager = source.meta.get("val") if source is not None else None
    if source is None or source.op == "placeholder" or not isinstance(eager, torch.Tensor) or eager._base is not None \
            or not eager.is_contiguous() or eager.storage_offset() != 0 \
            or eager.untyped_storage().nbytes() != eager.numel() * eager.element_size():
        raise Unsupported("as_strided of a graph input, a view, or a tensor that is not its storage's contiguous whole")
    new_size, _ = out_info(meta)
    position = linear_index(index_vars("i", len(new_size)), [sympify(s) for s in stride],
                            sympify(storage_offset or 0))
    idx = [FloorDiv(position, cs) if k == 0 else Mod(FloorDiv(position, cs), s)
           for k, (s, cs) in enumerate(zip(x.size, contiguous_strides(x.size)))]
    return IndexFunction(tuple(new_size), x.dtype, x.at(idx))
