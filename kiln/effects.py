"""Which FX nodes dead-code elimination keeps, whatever torch's version.

`torch.fx.Node.is_impure` is torch's own judgement and it changes between versions: torch 2.11 calls
`_linalg_check_errors` pure, so eliminating dead code dropped the check and a singular solve returned
numbers where eager raises. kiln keeps, besides what torch calls impure, every op whose schema returns
nothing (it runs for its check or its effect alone), every op that writes one of its arguments, and every op
that draws from a random generator (ATen's `nondeterministic_seeded` tag): an unused `torch.rand(2)` still
moves the generator in eager, so the next draw after the call depends on it.
"""
from __future__ import annotations

import torch


def has_effect(node: torch.fx.Node) -> bool:
    """Whether `node` must run even though nothing reads its result."""
    if node.is_impure():
        return True
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in node.target.tags:
        return True
    schema = node.target._schema
    return not schema.returns or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def written_arguments(schema: torch.FunctionSchema, args, kwargs: dict) -> list:
    """The arguments a call of an op of `schema` writes, as passed to it (`self` of `add_`, `out` of `add.out`, a
    list for an op writing several tensors; None for an optional one left out)."""
    return [kwargs.get(a.name) if a.kwarg_only or k >= len(args) else args[k]
            for k, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def eliminate_dead_code(graph: torch.fx.Graph) -> bool:
    """`graph.eliminate_dead_code()`, keeping every node `has_effect` keeps; whether anything was removed."""
    return graph.eliminate_dead_code(has_effect)
