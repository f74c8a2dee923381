"""Lowerings of tensor factories: constants and index ramps, no loads."""
from __future__ import annotations

import sympy
import torch

from kiln.lower import ir
from kiln.lower.index import index_vars, sympify
from kiln.lower.ops.common import operand, out_info
from kiln.lower.ops.registry import register
from kiln.lower.values import IndexFunction, Unsupported, cast

aten = torch.ops.aten


@register(aten.full.default, aten.scalar_tensor.default, aten.full_like.default)
def full(ctx, meta, *args, **kwargs):
    size, dtype = out_info(meta)
    value = args[1] if len(args) > 1 else (args[0] if not isinstance(args[0], (list, tuple)) else kwargs["fill_value"])
    if isinstance(value, float) and not (dtype.is_floating_point or dtype == torch.bool):
        value = int(value)
    if isinstance(value, (bool, int, float)):  # the value the tensor holds: 0.1 filled in bf16 is 0.10009765625
        value = ir.converted(value, _PYTHON_SCALAR_DTYPE[type(value)], dtype)
    return IndexFunction(size, dtype, operand(value, size, dtype))


_PYTHON_SCALAR_DTYPE = {bool: torch.bool, int: torch.int64, float: torch.float64}


@register(aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default,
          aten.new_empty.default, aten.new_empty_strided.default, aten.empty_permuted.default)
def empty(ctx, meta, *args, **kwargs):
    """Uninitialized memory: any value is allowed, zero is cheapest to fuse."""
    size, dtype = out_info(meta)
    return IndexFunction(size, dtype, operand(0, size, dtype))


@register(aten._efficientzerotensor.default)
def zero_tensor(ctx, meta, *args, **kwargs):
    """Autograd's zero gradient (sgn, abs of real numbers): eager's is a tensor that holds no memory, whose
    values are zeros; a fused zero costs nothing either."""
    size, dtype = out_info(meta)
    return IndexFunction(size, dtype, operand(0, size, dtype))


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def arange(ctx, meta, *args, **kwargs):
    size, dtype = out_info(meta)
    nums = [a for a in args if isinstance(a, (int, float, sympy.Basic))]
    if len(nums) == 1:
        start, step = 0, 1
    else:
        start, step = nums[0], (nums[2] if len(nums) > 2 else kwargs.get("step", 1))
    i = index_vars("i", 1)[0]
    if all(isinstance(v, int) or isinstance(v, sympy.Basic) for v in (start, step)):
        return IndexFunction(size, dtype, cast(ir.IndexValue(sympify(start) + sympify(step) * i, torch.int64), dtype))
    if not dtype.is_floating_point:
        raise Unsupported("float arange into an integer tensor")
    body = ir.Op("add", (ir.Const(float(start), torch.float64),
                         ir.Op("mul", (cast(ir.IndexValue(i, torch.int64), torch.float64),
                                       ir.Const(float(step), torch.float64)), torch.float64)), torch.float64)
    return IndexFunction(size, dtype, cast(body, dtype))


@register(torch.ops.prims.iota.default)
def iota(ctx, meta, length, *, start, step, **kwargs):
    size, dtype = out_info(meta)
    i = index_vars("i", 1)[0]
    return IndexFunction(size, dtype, cast(ir.IndexValue(sympify(start) + sympify(step) * i, torch.int64), dtype))
