"""Layouts and shapes of index functions, shared by the lowering driver (graph.py) and the rules (ops/).

How a value is best stored (`load_order_strides`, `dense_strides`) and a value padded with a constant
(`padded`): the driver stores matmul operands and realized values with them, and the rules of
`constant_pad_nd` and pooling use the same functions, so neither imports the other.
"""
from __future__ import annotations

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import affine_strides, index_vars, sympify
from kiln.lower.values import IndexFunction, Unsupported


def load_order_strides(v: IndexFunction):
    """Strides storing `v` in the order its first full-size load reads memory (its dims sorted by their
    stride in that load), or None (contiguous) when no load is a permutation of `v`'s dims."""
    variables = index_vars("i", v.ndim)
    for ld in ir.loads(v.body):
        aff = affine_strides(ld.index, variables) if ld.mask is None and not ld.indirect else None
        if aff is None:
            continue
        strides = aff[1]
        if not all(sympy.sympify(s).is_Integer for s in strides):
            return None
        dims = [d for d in range(v.ndim) if v.size[d] != 1]
        if any(int(strides[d]) <= 0 for d in dims) or len({int(strides[d]) for d in dims}) != len(dims):
            continue  # a broadcast or repeated stride: not a permutation
        order = sorted(dims, key=lambda d: -int(strides[d]))
        return None if order == dims else dense_strides(v.size, order)
    return None


def matmul_operand_strides(v: IndexFunction):
    """Strides storing `v`, a matmul's computed operand, so that the copy making it reads and writes memory in
    the same order (cuBLAS and the templates take either order of a matrix's two dims at no cost), or None
    (contiguous).

    A load that is a permutation of `v`'s dims gives its own order (`load_order_strides`). Through a view that
    merges dims (attention's batch and head dims folded into bmm's one batch dim) the load is not affine in
    `v`'s dims and gives no order; the matrix's last two dims are then still swapped when the load walks its
    rows contiguously and its columns apart (a transposed key `k.transpose(-2, -1)` read from the projection):
    stored row-major, that copy would write or read with a stride of a whole row."""
    stride = load_order_strides(v)
    if stride is not None or v.ndim < 2:
        return stride
    steps = _unit_steps(v)
    if steps is None or steps[-2] != 1 or steps[-1] <= 1:
        return None
    return dense_strides(v.size, [*range(v.ndim - 2), v.ndim - 1, v.ndim - 2])


def _unit_steps(v: IndexFunction) -> list[int] | None:
    """How far (in elements) the first full-size load of `v` moves in memory for one step along each of the
    last two dims, from index 0: a merged dim's `Mod`/`FloorDiv` terms step by its innermost part. None when
    no unmasked, direct load reads at a constant step along both."""
    variables = index_vars("i", v.ndim)
    matrix = variables[-2:]
    if any(not sympy.sympify(n).is_Integer or int(n) < 2 for n in v.size[-2:]):
        return None
    for ld in ir.loads(v.body):
        index = sympy.sympify(ld.index)
        if ld.mask is not None or ld.indirect or not set(matrix) <= index.free_symbols:
            continue
        origin = {x: 0 for x in variables}
        steps = [index.subs({**origin, x: 1}) - index.subs(origin) for x in matrix]
        if all(s.is_Integer for s in steps):
            return [int(s) for s in steps]
    return None


def dense_strides(size, order) -> list:
    """Strides of a dense tensor of `size` whose dims in `order` (outermost first) are laid out one after
    the other; dims not in `order` (size 1) get stride 1."""
    out = [sympy.Integer(1)] * len(size)
    step = sympy.Integer(1)
    for d in reversed(order):
        out[d] = step
        step = step * size[d]
    return out


def padded(x: IndexFunction, pad, size, dtype, value=0) -> IndexFunction:
    """`x` of `size` padded by `pad` (F.pad's order: last dim first, before/after pairs) with `value`;
    only in-range positions load from `x`."""
    out_vars = index_vars("i", x.ndim)
    idx, conds = list(out_vars), []
    for k in range(len(pad) // 2):
        d = x.ndim - 1 - k
        before = sympify(pad[2 * k])
        idx[d] = out_vars[d] - before
        if before > 0 if before.is_Integer else True:
            conds.append(sympy.Ge(idx[d], 0))
        after = sympify(pad[2 * k + 1])
        if after > 0 if after.is_Integer else True:
            conds.append(sympy.Lt(idx[d], x.size[d]))
    body = x.at(idx)
    if not conds:
        return IndexFunction(size, dtype, body)
    cond = sympy.And(*conds)
    if isinstance(value, float) and not dtype.is_floating_point:
        if not value.is_integer():
            raise Unsupported("fractional pad value for an integer tensor")
        value = int(value)
    fill = ir.Const(value if dtype != torch.bool else bool(value), dtype)
    where = ir.Op("where", (ir.IndexValue(cond, torch.bool), ir.add_mask(body, cond), fill), dtype)
    return IndexFunction(size, dtype, where)
