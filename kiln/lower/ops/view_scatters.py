"""Scatters into a view, and views as copies: index rewrites, no data-dependent writes.

`slice_scatter(input, src, ...)` is `input` with one of its slices replaced by `src`; `diagonal_scatter`
the same for a diagonal. Autograd writes a view's gradient into zeros of its base's shape this way
(slice_backward, diagonal_backward: every gradient through `x[1:]`, `x.diagonal()`, `torch.diag`, a
linalg op's triangular parts), so a backward that lowers them keeps its kernels. Each is pointwise: an
element inside the view reads `src` at its position in the view, every other element reads `input`; the
read of `src` is masked to the view, so it never reads outside `src`.

The `*_copy` ops (`permute_copy`, `view_copy`, `unfold_copy`, ...) are their views' values in a tensor of
their own: the view's rule computes them (a graph output gets its own buffer, as a clone's does).
"""
from __future__ import annotations

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import FloorDiv, Mod, index_vars
from kiln.lower.ops.common import out_info
from kiln.lower.ops.registry import LOWERINGS, register
from kiln.lower.ops.views import _dim, _norm_start
from kiln.lower.values import IndexFunction, Unsupported, cast, const

aten = torch.ops.aten


def _into_view(x: IndexFunction, src: IndexFunction, size, dtype, inside, src_index) -> IndexFunction:
    """`x` with the elements where `inside` holds read from `src` at `src_index` (sympy, over the output's index)."""
    out_vars = index_vars("i", len(size))
    piece = ir.add_mask(cast(src.at(src_index), dtype), inside)
    body = ir.Op("where", (ir.IndexValue(inside, torch.bool), piece, cast(x.at(out_vars), dtype)), dtype)
    return IndexFunction(size, dtype, body)


@register(aten.slice_scatter.default)
def slice_scatter(ctx, meta, x, src, dim=0, start=None, end=None, step=1):
    """Elements start, start + step, ... of `dim` (as many as `src` holds there) come from `src`."""
    size, dtype = out_info(meta)
    dim = _dim(dim, len(size))
    start = _norm_start(ctx, start, size[dim])
    out_vars = list(index_vars("i", len(size)))
    i, count = out_vars[dim], src.size[dim]
    inside = sympy.And(sympy.Ge(i, start), sympy.Lt(i, start + step * count))
    src_index = list(out_vars)
    if step == 1:
        src_index[dim] = i - start
    elif start.is_Integer:  # i = start + step * k: with i's residue fixed, k is i // step less start's quotient
        inside = sympy.And(inside, sympy.Eq(Mod(i, step), int(start) % step))
        src_index[dim] = FloorDiv(i, step) - int(start) // step
    else:  # a symbolic start: i - start, a multiple of step where `inside` holds (elsewhere the read is masked)
        inside = sympy.And(inside, sympy.Eq(Mod(i - start, step), 0))
        src_index[dim] = FloorDiv(i - start, step)
    return _into_view(x, src, size, dtype, inside, src_index)


@register(aten.diagonal_scatter.default)
def diagonal_scatter(ctx, meta, x, src, offset=0, dim1=0, dim2=1):
    """The diagonal of dims `dim1`, `dim2` (`offset` above it) comes from `src`'s last dim (as `diagonal` reads it)."""
    size, dtype = out_info(meta)
    dim1, dim2 = _dim(dim1, len(size)), _dim(dim2, len(size))
    if dim1 == dim2:
        raise Unsupported("diagonal_scatter of one dim with itself")
    out_vars = index_vars("i", len(size))
    a, b = out_vars[dim1], out_vars[dim2]
    inside = sympy.Eq(b - a, offset)
    along = a - max(-offset, 0)  # the element's position along the diagonal
    src_index = [v for d, v in enumerate(out_vars) if d not in (dim1, dim2)] + [along]
    return _into_view(x, src, size, dtype, inside, src_index)


@register(aten.unfold.default)
def unfold(ctx, meta, x, dimension, size, step):
    """Windows of `size` elements every `step` along `dimension`, each as a new last dim."""
    out_size, dtype = out_info(meta)
    out_vars = index_vars("i", len(out_size))
    if x.ndim == 0:
        return IndexFunction(out_size, dtype, x.body)
    d = _dim(dimension, x.ndim)
    idx = list(out_vars[:x.ndim])
    idx[d] = out_vars[d] * step + out_vars[-1]
    return IndexFunction(out_size, dtype, x.at(idx))


@register(aten.flip.default)
def flip(ctx, meta, x, dims):
    size, dtype = out_info(meta)
    flipped = {_dim(d, x.ndim) for d in dims} if x.ndim else set()
    out_vars = index_vars("i", x.ndim)
    idx = [x.size[k] - 1 - v if k in flipped else v for k, v in enumerate(out_vars)]
    return IndexFunction(size, dtype, x.at(idx))


@register(aten.repeat.default)
def repeat(ctx, meta, x, repeats):
    """`x` tiled `repeats` times per dim (leading repeats add dims): element i reads x at i modulo x's size."""
    size, dtype = out_info(meta)
    if any(s == 0 for s in size):
        return IndexFunction(size, dtype, const(0, dtype))
    out_vars = index_vars("i", len(size))
    lead = len(size) - x.ndim
    idx = [out_vars[lead + k] if r == 1 else Mod(out_vars[lead + k], s)
           for k, (s, r) in enumerate(zip(x.size, repeats[lead:]))]
    return IndexFunction(size, dtype, x.at(idx))


# copy variant -> the view whose values it holds
VIEW_COPIES = {
    aten.permute_copy.default: aten.permute.default, aten.view_copy.default: aten.view.default,
    aten.unbind_copy.int: aten.unbind.int, aten.slice_copy.Tensor: aten.slice.Tensor,
    aten.select_copy.int: aten.select.int, aten.split_copy.Tensor: aten.split.Tensor,
    aten.detach_copy.default: aten.detach.default,
}
for _copy, _view in VIEW_COPIES.items():
    register(_copy)(LOWERINGS[_view])
