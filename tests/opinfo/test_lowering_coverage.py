"""Every op kiln's lowering registry holds is exercised by an op test (issue #22: the op tests keep up).

An op is exercised when a row of the OpInfo table reached its lowering rule (the table records, per
row, the ATen overloads whose rules generated code), or when the functions of the lowering op table
(tests/lower/test_op_table.py) trace to it. A rule registered for an op that neither reaches fails
here: write a test for it, or exempt it below with the reason no test can reach it.
"""
from __future__ import annotations

import torch

from kiln.lower.ops import LOWERINGS
from lower import test_op_table as op_table
from opinfo import table
from support.lowering import trace

# Ops with a lowering rule that no op test reaches, and why. (Ops kiln decomposes before lowering are
# exempt by rule, in `unreachable()`.)
EXEMPT = {
    "aten.reshape.default": "CompositeImplicitAutograd: tracing replaces it by view/clone, so no graph holds it",
    "aten.div.Scalar_mode": "CompositeImplicitAutograd: tracing turns it into div.Tensor_mode",
    "aten.alias.default": "functionalization drops it (kiln.autograd.functionalize: ops returning their input)",
    "aten.lift_fresh_copy.default": "tracing emits it for a tensor constant built inside the function; OpInfo "
                                    "samples pass every tensor in",
    "aten.empty_strided.default": "uninitialized results: OpInfo's empty* ops are left out (nothing to compare)",
    "aten.new_empty_strided.default": "uninitialized results: OpInfo's empty* ops are left out (nothing to compare)",
    "prims.iota.default": "a prims op kiln's own tracing does not produce (it keeps aten.arange.start_step): "
                          "only graphs traced elsewhere (torch.compile(backend=kiln.inductor)) hold it",
    "prims.copy_strided.default": "a prims op kiln's own tracing does not produce: only graphs traced elsewhere "
                                  "(torch.compile(backend=kiln.inductor)) hold it",
}


def op_table_targets() -> set[str]:
    """The ATen overloads the op table's functions trace to, through kiln's decompositions."""
    g = torch.Generator().manual_seed(0)
    f, f2 = torch.randn(3, 5, generator=g), torch.randn(5, generator=g)
    i, i2 = torch.randint(-5, 5, (3, 5), generator=g), torch.randint(-5, 5, (5,), generator=g)
    b, b2 = f > 0, f2 > 0
    cases = [(op_table.FLOAT_UNARY, (f,)), (op_table.FLOAT_BINARY, (f, f2)), (op_table.INT_UNARY, (i,)),
             (op_table.INT_BINARY, (i, i2)), (op_table.BOOL_OPS, (b, b2)), (op_table.REDUCTIONS, (f,)),
             (op_table.VIEWS, (torch.randn(2, 3, 5, generator=g),))]
    targets = set()
    for functions, inputs in cases:
        for fn in functions.values():
            traced = trace(lambda *xs, fn=fn: fn(*xs), *inputs)  # builtins: make_fx counts their defaults
            targets |= {str(n.target) for n in traced.graph.nodes if n.op == "call_function"}
    return targets


def unreachable() -> set[str]:
    """Ops kiln's decomposition table rewrites: a graph holding one is retraced before lowering
    (`kiln.pipeline.decompose`), so their rules serve no graph of the pipeline."""
    from kiln.lower.decompositions import decomposition_table

    table = decomposition_table()
    return {str(op) for op in LOWERINGS if op in table}


def opinfo_targets() -> set[str]:
    return {op for row in table.load()["rows"].values() for op in row["lowered"]}


def test_every_lowering_is_exercised_by_an_op_test():
    exercised = opinfo_targets() | op_table_targets() | unreachable()
    unexercised = sorted(str(op) for op in LOWERINGS if str(op) not in exercised and str(op) not in EXEMPT)
    assert not unexercised, \
        f"lowering rules no op test reaches (test them, or exempt them with a reason): {unexercised}"


def test_exemptions_are_current():
    """An exempt op that a test now reaches, or that has no rule any more, leaves the list."""
    registered = {str(op) for op in LOWERINGS}
    exercised = opinfo_targets() | op_table_targets() | unreachable()
    stale = sorted(op for op in EXEMPT if op not in registered or op in exercised)
    assert not stale, stale
