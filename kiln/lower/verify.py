"""The IR verifier: structural invariants every LoweredGraph must satisfy (run in tests and on compile)."""
from __future__ import annotations

import sympy

from kiln.lower import ir
from kiln.lower.index import index_vars


class IRError(AssertionError):
    pass


def verify(graph: ir.LoweredGraph) -> None:
    """Raise IRError naming the first broken invariant."""
    defined = {b.name for b in graph.inputs} | set(graph.constants)
    for node in graph.nodes:
        if node.name in defined:
            raise IRError(f"{node.name} defined twice")
        if isinstance(node, ir.ComputedBuffer):
            _check_computed(node, defined)
        elif isinstance(node, ir.MultiOutput):
            if node.source not in defined:
                raise IRError(f"{node.name} reads {node.source} before it is defined")
        else:
            missing = ir.extern_reads(node) - defined
            if missing:
                raise IRError(f"extern {node.name} reads undefined {sorted(missing)}")
        defined.add(node.name)
    for o in graph.outputs:
        if isinstance(o, ir.TensorRef) and o.buf not in defined:
            raise IRError(f"output reads undefined {o.buf}")


def _check_computed(node: ir.ComputedBuffer, defined: set) -> None:
    d = node.data
    if tuple(node.layout.size) != tuple(d.ranges):
        raise IRError(f"{node.name}: layout size {node.layout.size} != ranges {d.ranges}")
    allowed = set(index_vars("i", len(d.ranges)))
    if isinstance(d, ir.Reduction):
        if d.reduction_type not in ir.REDUCTION_TYPES:
            raise IRError(f"{node.name}: unknown reduction {d.reduction_type}")
        allowed |= set(index_vars("r", len(d.reduction_ranges)))
    for e in ir.iter_exprs(d.body):
        if isinstance(e, ir.Load):
            if e.buf not in defined:
                raise IRError(f"{node.name} loads {e.buf} before it is defined")
            _check_vars(node, sympy.sympify(e.index), allowed)
        elif isinstance(e, ir.IndexValue):
            _check_vars(node, sympy.sympify(e.expr), allowed)
        elif isinstance(e, ir.Op):
            if e.name not in ir.OP_NAMES:
                raise IRError(f"{node.name}: unknown op {e.name}")
            if e.name != "where" and e.name != "cast" and len({a.dtype for a in e.args}) > 1:
                raise IRError(f"{node.name}: {e.name} mixes dtypes {[a.dtype for a in e.args]}")
            if e.name == "where" and (e.args[0].dtype != ir.torch.bool or e.args[1].dtype != e.args[2].dtype):
                raise IRError(f"{node.name}: where needs a bool condition and equal branch dtypes")


def _check_vars(node, expr, allowed) -> None:
    loopish = {s for s in expr.free_symbols if s.name[0] in "ir" and s.name[1:].isdigit()}
    if not loopish <= allowed:
        raise IRError(f"{node.name}: index uses {sorted(map(str, loopish - allowed))} outside its ranges")
