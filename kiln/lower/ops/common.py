"""Helpers shared by the lowering rules: broadcasting, operands, promotion."""
from __future__ import annotations

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import index_vars, sympify
from kiln.lower.values import IndexFunction, SizeScalar, Unsupported, cast, const

SUPPORTED_DTYPES = {torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                    torch.int16, torch.int8, torch.uint8, torch.bool}


def out_info(meta) -> tuple[tuple, torch.dtype]:
    """(size, dtype) of a node's fake result; refuses dtypes the code generators do not handle."""
    if not isinstance(meta, torch.Tensor):
        raise Unsupported("result is not a single tensor")
    if meta.dtype not in SUPPORTED_DTYPES:
        raise Unsupported(f"dtype {meta.dtype}")
    if meta.device.type != "cpu" and meta.device.type != "cuda":
        raise Unsupported(f"device {meta.device}")
    return tuple(sympify(s) for s in meta.shape), meta.dtype


def broadcast(v: IndexFunction, size) -> ir.Expr:
    """`v`'s element at the output index of a tensor of `size` (numpy broadcasting)."""
    n, r = len(size), v.ndim
    if r > n:
        raise Unsupported("operand has more dims than the result")
    out_vars = index_vars("i", n)
    idx = []
    for k in range(r):
        d = n - r + k
        idx.append(sympy.Integer(0) if (v.size[k] == 1 and size[d] != 1) else out_vars[d])
    return v.at(idx)


def broadcast_sizes(*sizes) -> tuple:
    """The size several sizes broadcast to (numpy's rule), for sizes that may be symbolic. Capture's fake
    tensors already checked that the sizes broadcast, and symbolic sizes are never 1 (torch specializes 0 and
    1), so each dimension is its one size other than 1, or 1."""
    rank = max(map(len, sizes), default=0)
    result = []
    for d in range(rank):
        named = [s[len(s) - rank + d] for s in sizes if len(s) - rank + d >= 0]
        result.append(next((sympify(n) for n in named if n != 1), sympy.Integer(1)))
    return tuple(result)


def operand(a, size, dtype) -> ir.Expr:
    """A tensor, Python scalar or size expression as an element expression of `dtype`."""
    if isinstance(a, IndexFunction):
        if a.dtype not in SUPPORTED_DTYPES:
            raise Unsupported(f"dtype {a.dtype}")
        return cast(broadcast(a, size), dtype)
    if isinstance(a, (bool, int, float)):
        if isinstance(a, float) and not dtype.is_floating_point and dtype != torch.bool:
            raise Unsupported("float scalar in an integer op")
        return const(a, dtype)
    if isinstance(a, sympy.Basic):
        return cast(ir.IndexValue(a, torch.int64), dtype)
    raise Unsupported(f"operand of type {type(a).__name__}")


def scalar_operand(a, dtype) -> ir.Expr:
    """A scalar argument (a fill value, an alpha) as an element expression of `dtype`. Under dynamic shapes an
    int argument arrives as a size symbol and a float one computed from sizes as a SizeScalar, neither of which
    folds to a constant; a Python number converts as eager's fill does (a float into an integer dtype truncates)."""
    if isinstance(a, (bool, int, float)):
        return const(a, dtype)
    return operand(a, (), dtype)


def _meta_like(a):
    if isinstance(a, SizeScalar):  # a Python float of eager's: a weak scalar in promotion
        return 1.0
    if isinstance(a, IndexFunction):
        return torch.empty((1,) * a.ndim, dtype=a.dtype, device="meta")
    if isinstance(a, sympy.Basic):
        return 1
    return a


def promote(a, b) -> torch.dtype:
    """The dtype eager computes `a op b` in (torch.result_type rules, 0-dim tensors included)."""
    ma, mb = _meta_like(a), _meta_like(b)
    if not isinstance(ma, torch.Tensor):
        ma, mb = mb, ma
    if not isinstance(ma, torch.Tensor):
        raise Unsupported("no tensor operand")
    return torch.result_type(ma, mb)
