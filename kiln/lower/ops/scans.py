"""Cumulative sums and products as dense reductions: element j of the scanned dim reduces elements 0..j.

Each output element is its own masked reduction over the whole dim (`where(r <= j, x[r], identity)`), so
the work is the output's size times the dim's length: up to `DENSE_LIMIT` (kiln/lower/ops/scatters.py),
longer scans stay ATen's sequential ones. Values are accumulated in eager's kernel's dtype (`_accumulator`).
"""
from __future__ import annotations

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import index_vars
from kiln.lower.ops.common import out_info
from kiln.lower.ops.reductions import reduce
from kiln.lower.ops.registry import register
from kiln.lower.ops.scatters import dense_fits
from kiln.lower.values import IndexFunction, Unsupported, cast, const

aten = torch.ops.aten


def _scan(rtype: str, identity):
    def rule(ctx, meta, x, dim, dtype=None):
        size, out = out_info(meta)
        if x.ndim == 0:
            return IndexFunction(size, out, cast(x.body, out))
        dim = dim + x.ndim if dim < 0 else dim
        length = size[dim]
        if out == torch.bool or not dense_fits(ctx, size, length):
            raise Unsupported("a scan too long for a dense reduction")
        acc = _accumulator(out, meta.device)
        n = x.ndim
        out_vars = index_vars("i", n + 1)
        r = out_vars[n]
        upto = ir.IndexValue(sympy.Le(r, out_vars[dim]), torch.bool)
        value = cast(x.at([r if k == dim else out_vars[k] for k in range(n)]), acc)
        body = ir.Op("where", (upto, value, const(identity, acc)), acc)
        total = reduce(ctx, IndexFunction(tuple(size) + (length,), acc, body), [n], False, rtype, acc)
        return IndexFunction(size, out, cast(total.body, out))
    return rule


def _accumulator(out: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype eager's scan kernel accumulates in (`acc_type`): float32 for half types; on the CPU, double for
    float32 (a running product through 1e30 * 1e30 comes back within range, `1e8 + 1 - 1e8` keeps its 1), where
    CUDA's kernel accumulates float32 as it is."""
    if out in (torch.float16, torch.bfloat16):
        return torch.float32
    if out == torch.float32 and device.type == "cpu":
        return torch.float64
    return out


register(aten.cumsum.default)(_scan("sum", 0))
register(aten.cumprod.default)(_scan("prod", 1))
