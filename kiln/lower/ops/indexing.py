"""Gather-style lowerings: loads whose index is read from another tensor.

The source tensor is realized (it is addressed in memory) and read through a
`Load` whose index names symbols `ind<k>`, each bound to an integer expression
over the index tensors (`Load.indirect`). Indices are wrapped when negative (as
advanced indexing allows) and clamped into range, so a bad index never reads
outside the buffer.
"""
from __future__ import annotations

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import index_vars, linear_index
from kiln.lower.ops import register
from kiln.lower.ops.common import broadcast, out_info
from kiln.lower.values import TensorValue, Unsupported, cast, const

aten = torch.ops.aten


def _safe_index(e: ir.Expr, size) -> ir.Expr:
    """`e` as an int64 index into a dim of `size`: negative values wrap, the result is clamped in range."""
    e = cast(e, torch.int64)
    n = ir.IndexValue(sympy.sympify(size), torch.int64)
    wrapped = ir.Op("where", (ir.Op("lt", (e, const(0, torch.int64)), torch.bool),
                              ir.Op("add", (e, n), torch.int64), e), torch.int64)
    hi = ir.Op("sub", (n, const(1, torch.int64)), torch.int64)
    return ir.Op("minimum", (ir.Op("maximum", (wrapped, const(0, torch.int64)), torch.int64), hi), torch.int64)


def gather_load(ctx, x: TensorValue, idx: list) -> ir.Expr:
    """`x` at `idx`, where each entry is a sympy index or an IR expression (an indirect index)."""
    x = ctx.realize(x)
    buf, offset, strides = x.buffer_view()
    binds, parts = [], []
    for k, v in enumerate(idx):
        if isinstance(v, (ir.Load, ir.Op, ir.Const, ir.IndexValue)):
            sym = sympy.Symbol(f"ind{len(binds)}", integer=True)
            binds.append((sym, _safe_index(v, x.size[k])))
            parts.append(sym)
        else:
            parts.append(v)
    return ir.Load(buf, linear_index(parts, strides, offset), x.dtype, None, tuple(binds))


@register(aten.embedding.default)
def embedding(ctx, meta, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    size, dtype = out_info(meta)
    out_vars = index_vars("i", len(size))
    row = indices.at(out_vars[:-1])
    return TensorValue(size, dtype, gather_load(ctx, weight, [row, out_vars[-1]]))


@register(aten.index_select.default)
def index_select(ctx, meta, x, dim, index):
    size, dtype = out_info(meta)
    dim = dim + x.ndim if dim < 0 else dim
    out_vars = list(index_vars("i", len(size)))
    idx = list(out_vars)
    if x.ndim:
        idx[dim] = index.at([out_vars[dim]] if index.ndim else [])
    return TensorValue(size, dtype, gather_load(ctx, x, idx))


@register(aten.gather.default)
def gather(ctx, meta, x, dim, index, sparse_grad=False):
    size, dtype = out_info(meta)
    if x.ndim == 0:
        raise Unsupported("gather from a 0-dim tensor")
    dim = dim + x.ndim if dim < 0 else dim
    out_vars = list(index_vars("i", len(size)))
    idx = list(out_vars)
    idx[dim] = index.at(out_vars)
    return TensorValue(size, dtype, gather_load(ctx, x, idx))


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
            sub = TensorValue(bsize, t.dtype, broadcast(t, bsize))
            idx.append(sub.at(bvars))
    return TensorValue(size, dtype, gather_load(ctx, x, idx))
