"""Reduction lowerings: a `Reduction` buffer over the reduced dims, the input inlined as its body.

A reduction is always realized (computed once, never recomputed by consumers);
its input, if pointwise, is fused in as the body (a prologue). Mean and variance
are pointwise epilogues over sum / welford buffers.
"""
from __future__ import annotations

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import index_vars, product
from kiln.lower.ops.common import SUPPORTED_DTYPES, out_info
from kiln.lower.ops.registry import register
from kiln.lower.ops.views import reshape_value
from kiln.lower.values import IndexFunction, Unsupported, cast, const, from_buffer

aten = torch.ops.aten


def _dims(dims, n):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(n))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d + n if d < 0 else d for d in dims} if n else set())


def reduce(ctx, x: IndexFunction, dims, keepdim: bool, rtype: str, dtype: torch.dtype,
           body_dtype=None) -> IndexFunction:
    """Realize `rtype` of `x` over `dims` as a Reduction buffer of `dtype`; returns a load of it."""
    if x.dtype not in SUPPORTED_DTYPES:
        raise Unsupported(f"dtype {x.dtype}")
    n = x.ndim
    dims = _dims(dims, n)
    kept = [k for k in range(n) if k not in dims]
    red = [k for k in dims if x.size[k] != 1]
    out_size = tuple(sympy.Integer(1) if k in dims else x.size[k] for k in range(n)) if keepdim \
        else tuple(x.size[k] for k in kept)
    out_vars = index_vars("i", len(out_size))
    r_vars = index_vars("r", len(red))
    idx = []
    for k in range(n):
        if k in red:
            idx.append(r_vars[red.index(k)])
        elif k in dims:
            idx.append(sympy.Integer(0))
        else:
            idx.append(out_vars[k] if keepdim else out_vars[kept.index(k)])
    body = cast(x.at(idx), body_dtype or dtype)
    if not red:
        return IndexFunction(out_size, dtype, cast(_trivial(rtype, body), dtype))
    if any(x.size[k] == 0 for k in red):
        return IndexFunction(out_size, dtype, _of_nothing(rtype, dtype))
    layout = ir.Layout.contiguous(out_size, dtype)
    # The same reduction of the same values (`x.sum(-1, keepdim=True)` written twice, or with and without keepdim)
    # is one buffer: computed once, wherever its readers land in kernels. Both are contiguous over the same
    # dims of more than one element, so the first buffer is read in the second's shape at the same addresses.
    key = (rtype, tuple(s for s in out_size if s != 1), tuple(x.size[k] for k in red), dtype, body)
    name = ctx.computed_reductions.get(key)
    if name is None:
        name = ctx.computed_reductions[key] = ctx.new_name()
        ctx.add_buffer(ir.ComputedBuffer(name, layout, ir.Reduction(
            out_size, tuple(x.size[k] for k in red), rtype, body)))
    return from_buffer(name, layout)


def _trivial(rtype, body):
    """A reduction over a single element."""
    if rtype in ("argmax", "argmin"):
        return const(0, torch.int64)
    if rtype == "any":
        return cast(body, torch.bool)
    if rtype == "welford_m2":
        return const(0, body.dtype)
    return body


# A reduction over no element: its identity (Welford's mean of nothing is NaN, as eager's mean; its sum of squares
# 0, which the variance divides by a count of 0). No kernel reads the empty input (a load at an index that does not
# depend on the empty range, left unmasked, would read past it).
_IDENTITY = {"sum": 0, "prod": 1, "any": False, "welford_mean": float("nan"), "welford_m2": 0}


def _of_nothing(rtype: str, dtype: torch.dtype):
    """The value of `rtype` over no element; eager raises for the others (max or argmax of an empty range): they
    stay ATen's, which raises."""
    if rtype not in _IDENTITY:
        raise Unsupported(f"{rtype} over an empty range")
    return const(_IDENTITY[rtype], dtype)


def _numel(x, dims):
    return product(x.size[k] for k in _dims(dims, x.ndim))


@register(aten.sum.dim_IntList, aten.sum.default)
def sum_(ctx, meta, x, dims=None, keepdim=False, dtype=None):
    _, out = out_info(meta)
    return reduce(ctx, x, dims, keepdim, "sum", out)


@register(aten.prod.dim_int, aten.prod.default)
def prod(ctx, meta, x, dim=None, keepdim=False, dtype=None):
    _, out = out_info(meta)
    return reduce(ctx, x, dim, keepdim, "prod", out)


@register(aten.mean.dim, aten.mean.default)
def mean(ctx, meta, x, dims=None, keepdim=False, dtype=None):
    size, out = out_info(meta)
    acc = torch.float64 if out == torch.float64 else torch.float32
    s = reduce(ctx, x, dims, keepdim, "sum", acc)
    q = ir.Op("truediv", (s.body, cast(ir.IndexValue(_numel(x, dims), torch.int64), acc)), acc)
    return IndexFunction(size, out, cast(q, out))


@register(aten.amax.default)
def amax(ctx, meta, x, dims=(), keepdim=False):
    _, out = out_info(meta)
    return reduce(ctx, x, dims, keepdim, "max", out)


@register(aten.amin.default)
def amin(ctx, meta, x, dims=(), keepdim=False):
    _, out = out_info(meta)
    return reduce(ctx, x, dims, keepdim, "min", out)


def _minmax_all(rtype):
    """max() / min() of every element: amax / amin over all dims. Of an empty tensor eager raises (there is no
    identity to return), so that stays the ATen call."""
    def rule(ctx, meta, x):
        _, out = out_info(meta)
        if any(s == 0 for s in x.size):
            raise Unsupported("max or min of an empty tensor")
        return reduce(ctx, x, None, False, rtype, out)
    return rule


register(aten.max.default)(_minmax_all("max"))
register(aten.min.default)(_minmax_all("min"))


def _arg(rtype):
    def rule(ctx, meta, x, dim=None, keepdim=False):
        _, out = out_info(meta)
        if dim is None:
            x = reshape_value(x, (product(x.size),))
            dim = 0
        return reduce(ctx, x, [dim], keepdim, rtype, out, body_dtype=x.dtype)
    return rule


register(aten.argmax.default)(_arg("argmax"))
register(aten.argmin.default)(_arg("argmin"))


def _minmax_dim(rtype):
    def rule(ctx, meta, x, dim, keepdim=False):
        _, out = out_info(meta[0])
        values = reduce(ctx, x, [dim], keepdim, rtype, out)
        indices = reduce(ctx, x, [dim], keepdim, "arg" + rtype, torch.int64, body_dtype=x.dtype)
        return (values, indices)
    return rule


register(aten.max.dim)(_minmax_dim("max"))
register(aten.min.dim)(_minmax_dim("min"))


@register(aten.any.default, aten.any.dim, aten.any.dims)
def any_(ctx, meta, x, dim=None, keepdim=False):
    _, out = out_info(meta)
    return reduce(ctx, x, dim, keepdim, "any", out, body_dtype=torch.bool)


def _variance_acc(x: IndexFunction, device: torch.device) -> torch.dtype:
    """The dtype aten.var accumulates in: eager's CPU kernel (std_var_kernel) accumulates in double for every
    float dtype, so float32 values whose squared deviations overflow float32 still give a finite variance;
    CUDA's accumulates float32 in float32."""
    return torch.float64 if x.dtype == torch.float64 or device.type == "cpu" else torch.float32


def _float_acc(x: IndexFunction) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _welford(ctx, x, dims, keepdim, correction, acc):
    if not x.dtype.is_floating_point:
        raise Unsupported("variance of an integer tensor")
    mean_ = reduce(ctx, x, dims, keepdim, "welford_mean", acc)
    m2 = reduce(ctx, x, dims, keepdim, "welford_m2", acc)
    n = _numel(x, dims)
    denom = ir.Op("maximum", (ir.Op("sub", (cast(ir.IndexValue(n, torch.int64), acc), const(correction, acc)), acc),
                              const(0, acc)), acc)
    var = ir.Op("truediv", (m2.body, denom), acc)
    return mean_, IndexFunction(m2.size, acc, var)


def _correction(correction, unbiased=None):
    if correction is None:
        return 1 if unbiased is None or unbiased else 0
    return correction


@register(aten.var_mean.correction)
def var_mean(ctx, meta, x, dims=None, *, correction=None, keepdim=False):
    _, out = out_info(meta[0])
    # var_mean is also what the layer, group and batch norm decompositions compute their statistics with, and
    # eager's norm kernels accumulate float32 in float32 (an overflowing variance makes their output 0)
    mean_, var = _welford(ctx, x, dims, keepdim, _correction(correction), _float_acc(x))
    return (IndexFunction(var.size, out, cast(var.body, out)), IndexFunction(mean_.size, out, cast(mean_.body, out)))


@register(aten.var.correction)
def var(ctx, meta, x, dims=None, *, correction=None, keepdim=False):
    _, out = out_info(meta)
    _, v = _welford(ctx, x, dims, keepdim, _correction(correction), _variance_acc(x, meta.device))
    return IndexFunction(v.size, out, cast(v.body, out))


@register(aten.std.correction)
def std(ctx, meta, x, dims=None, *, correction=None, keepdim=False):
    _, out = out_info(meta)
    _, v = _welford(ctx, x, dims, keepdim, _correction(correction), _variance_acc(x, meta.device))
    return _sqrt_as(v, out)


@register(aten.std_mean.correction)
def std_mean(ctx, meta, x, dims=None, *, correction=None, keepdim=False):
    _, out = out_info(meta[0])
    mean_, v = _welford(ctx, x, dims, keepdim, _correction(correction), _variance_acc(x, meta[0].device))
    return _sqrt_as(v, out), IndexFunction(mean_.size, out, cast(mean_.body, out))


def _sqrt_as(variance: IndexFunction, out: torch.dtype) -> IndexFunction:
    """The standard deviation from `variance`, its square root taken in the variance's dtype (eager's
    accumulation dtype) and only then cast to `out`."""
    return IndexFunction(variance.size, out, cast(ir.Op("sqrt", (variance.body,), variance.dtype), out))


@register(aten.linalg_vector_norm.default)
def vector_norm(ctx, meta, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    size, out = out_info(meta)
    if not out.is_floating_point or ord not in (1, 2, float("inf")):
        raise Unsupported(f"norm of order {ord}")
    acc = torch.float64 if out == torch.float64 else torch.float32
    xa = IndexFunction(x.size, acc, cast(x.body, acc))
    mag = IndexFunction(x.size, acc, ir.Op("abs", (xa.body,), acc))
    if ord == 2:
        sq = IndexFunction(x.size, acc, ir.Op("mul", (xa.body, xa.body), acc))
        r = reduce(ctx, sq, dim, keepdim, "sum", acc)
        return IndexFunction(size, out, cast(ir.Op("sqrt", (r.body,), acc), out))
    r = reduce(ctx, mag, dim, keepdim, "sum" if ord == 1 else "max", acc)
    return IndexFunction(size, out, cast(r.body, out))
