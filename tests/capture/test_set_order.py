"""A set made in the compiled frame iterates in eager's order, before and after a graph break.

CPython's set order depends on how the set was made, not only on its items: `set(a_set)`, `set(a_dict)` and
`s.update(a_frozenset)` merge at once into a presized table, adding one item at a time grows the table step by
step, and a table of another size puts colliding strings in another order. kiln's set tracker runs every
operation on a real shadow set, as the traced code runs it (a merge stays a merge), and a set that crosses a
break is rebuilt by repeating how it was made (`SetValue.recipe`); a frozenset constant is passed as itself,
not rebuilt from its repr. Before, both a merge replayed item by item and a set rebuilt from a literal could
iterate otherwise (CPython's test_collections `TestNamedTuple.test_name_conflicts`: `namedtuple('T', words)`
and `tuple(words)` of a 200-word set literal saw two orders). Strings hash per process, so each case is
compared with eager in this process, over enough words to collide.
"""
import contextlib
import io
import random
import string

import pytest
import torch

import kiln
from support.capture import assert_same

_RNG = random.Random(0)
WORDS = ["".join(_RNG.choice(string.ascii_lowercase) for _ in range(6)) for _ in range(80)]


def literal_across_a_break(x):
    s = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
         "nu", "xi", "omicron", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega"}
    before = list(s)
    print("break")
    return x + 1, before, list(s)


def from_a_list(x):
    s = set(WORDS)
    print("break")
    return x + 1, list(s)


def from_a_dict_then_discard(x):
    s = set(dict.fromkeys(WORDS))
    s.discard(WORDS[3])
    before = list(s)
    print("break")
    return x + 1, before, list(s)


def starred_into_a_literal(x):
    s = {*WORDS[:40], *tuple(WORDS[40:])}
    return x + 1, list(s)


def merged_frozenset_then_added(x):
    s = set(frozenset(WORDS))
    s.update(WORDS[:5])
    s.add("extra")
    print("break")
    return x + 1, list(s), sorted(s | {"q"})


def frozenset_constant_across_a_break(x):
    words = frozenset({"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"})
    print("break")
    return x + 1, list(words)


@pytest.mark.allows_fallback("graph_break: print, a break on purpose, so the set crosses it")
@pytest.mark.parametrize("fn", [literal_across_a_break, from_a_list, from_a_dict_then_discard, starred_into_a_literal,
                                merged_frozenset_then_added, frozenset_constant_across_a_break])
def test_set_iterates_in_eagers_order(fn):
    compiled = kiln.compile(fn, backend="eager")
    with contextlib.redirect_stdout(io.StringIO()):
        for _ in range(2):
            x = torch.randn(2)
            assert_same(fn(x), compiled(x))
