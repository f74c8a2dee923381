"""kiln/runtime/symbolic_sizes.py: symbolic sizes as plain data for the compile cache. Expressions round-trip
through a table of known classes (nothing is parsed as Python), a product's guards are added again only where they
hold at this process's sizes, and a key tells environments apart that would make different products."""
from __future__ import annotations

import json

import pytest
import sympy
import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._sympy.functions import FloorDiv, Max, ModularIndexing

from kiln.runtime import symbolic_sizes
from kiln.runtime.graph_cache import Uncacheable


def _env(*hints: int) -> tuple[ShapeEnv, list[torch.SymInt]]:
    """A shape environment with a size symbol per hint, and those sizes."""
    from torch._dynamo.source import ConstantSource

    env = ShapeEnv()
    sizes = [env.create_symintnode(env.create_symbol(h, ConstantSource(f"size{k}")), hint=h)
             for k, h in enumerate(hints)]
    return env, sizes


def test_expressions_round_trip_through_json():
    env, (a, b) = _env(6, 10)
    s, t = a.node.expr, b.node.expr
    for expr in (s, s * t + 3, FloorDiv(s + 2, 3), ModularIndexing(t, 2, 4), Max(s, t - 1), sympy.Rational(1, 2) * s,
                 sympy.Eq(s, t), sympy.Ne(FloorDiv(s, 2), 1), sympy.And(s >= 2, t < 100), sympy.true):
        described = json.loads(json.dumps(symbolic_sizes.encode_expr(expr)))
        assert symbolic_sizes.decode_expr(described, symbolic_sizes.symbols_of(env)) == expr


def test_a_class_outside_the_table_is_refused_both_ways():
    env, (a,) = _env(6)
    with pytest.raises(Uncacheable, match="sin"):
        symbolic_sizes.encode_expr(sympy.sin(a.node.expr))
    symbols = symbolic_sizes.symbols_of(env)
    for described in (["Function", 1], ["__import__", "os"], {"s": "nope"}, "s0"):
        with pytest.raises(ValueError):
            symbolic_sizes.decode_expr(described, symbols)


def test_a_symbolic_int_is_made_again_in_the_environment():
    env, (a, b) = _env(6, 10)
    described = symbolic_sizes.encode_int(a * b + 1)
    made = symbolic_sizes.decode_int(json.loads(json.dumps(described)), env)
    assert isinstance(made, torch.SymInt) and made.node.shape_env is env
    assert str(made.node.expr) == str((a * b + 1).node.expr) and made.node.hint == 61
    assert symbolic_sizes.decode_int(7, env) == 7
    with pytest.raises(Uncacheable):
        symbolic_sizes.encode_int(torch.sym_float(a))


def test_guards_are_added_again_only_where_they_hold():
    env, (a,) = _env(6)
    s = a.node.expr
    kept = [symbolic_sizes.encode_expr(e) for e in (sympy.Ne(s, 3), s >= 4)]
    symbolic_sizes.replay_guards(env, kept)
    assert [g.expr for g in env.guards] == [sympy.Ne(s, 3), s >= 4]
    assert symbolic_sizes.guards_since(env, 0) == kept

    other, (b,) = _env(3)  # made for a size 6, loaded where the size is 3: nothing is added
    with pytest.raises(symbolic_sizes.GuardsDoNotHold, match="Ne"):
        symbolic_sizes.replay_guards(other, kept)
    assert other.guards == []


def test_the_key_tells_environments_apart_but_not_their_hints():
    env, (a,) = _env(6)
    same, _ = _env(9)
    assert symbolic_sizes.env_digest(env) == symbolic_sizes.env_digest(same)  # hints are not in the key
    guarded, (c,) = _env(6)
    symbolic_sizes.replay_guards(guarded, [symbolic_sizes.encode_expr(c.node.expr >= 4)])
    assert symbolic_sizes.env_digest(guarded) != symbolic_sizes.env_digest(env)  # a guard, and the range it set
    assert symbolic_sizes.describe_env(guarded)["ranges"][c.node.expr.name][0] == "4"
