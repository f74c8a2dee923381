"""The lowering registry: one rule per ATen op overload.

A rule is `rule(ctx: GraphLowering, meta, *args, **kwargs) -> value` where
`meta` is the node's fake result (sizes, dtype, strides as eager produces them)
and tensor arguments arrive as `IndexFunction`s. Rules live in submodules by op
family and register themselves with `@register(op, ...)`.
"""
from __future__ import annotations

from kiln.lower.ops import (  # noqa: F401  (fill the table)
    creation,
    indexing,
    pointwise,
    pooling,
    reductions,
    scans,
    scatters,
    view_scatters,
    views,
)
from kiln.lower.ops.registry import LOWERINGS, register

__all__ = ["LOWERINGS", "register"]
