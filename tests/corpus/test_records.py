"""Dataclasses and tuples as Dynamo's test_functions exercises them: frozen dataclasses (their generated
__eq__ and __hash__, the `__class__` descriptor, FrozenInstanceError, dataclasses.replace/asdict/fields),
typing.NamedTuple with methods and properties, and collections.namedtuple made inside the compiled function."""
import collections
import dataclasses
import typing

import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import assert_same, graph_count

from .reference import GraphCounter, Table, check, t

torch.manual_seed(0)
cases = Table()
A = t(4)


@dataclasses.dataclass(frozen=True)
class Key:
    a: int
    b: str


@dataclasses.dataclass(frozen=True)
class Scaled:
    x: torch.Tensor
    n: int = 2

    def __post_init__(self):
        object.__setattr__(self, "n", self.n + 1)


class Pair(typing.NamedTuple):
    x: torch.Tensor
    k: int = 2

    def scaled(self):
        return self.x * self.k

    @property
    def doubled(self):
        return self.x * 2


@cases((A,))
def frozen_dataclass_eq_hash_and_class(a):
    k1, k2 = Key(1, "x"), Key(1, "x")
    return a + 1, k1 == k2, k1 != Key(2, "x"), k1.__class__ is Key, hash(k1) == hash(k2), {k1: 3}[k2]


@cases((A,))
def frozen_dataclass_post_init_and_assignment_error(a):
    s = Scaled(a)
    try:
        s.n = 5
    except dataclasses.FrozenInstanceError:
        a = a + 1
    return s.x * s.n + a


@cases((A,))
def frozen_dataclass_helpers(a):
    k = Key(1, "x")
    return (a * dataclasses.replace(k, a=2).a, dataclasses.asdict(k), dataclasses.astuple(k),
            [f.name for f in dataclasses.fields(k)])


@cases((A,))
def named_tuple_methods_and_properties(a):
    p = Pair(a)
    return p.scaled(), p.doubled, p._replace(k=5).scaled(), p, p._fields, len(p), p[1], Pair(a, 3) == Pair(a, 3)


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_record_case_matches_eager(fn, calls, options):
    counts = check(fn, *calls, **options)
    assert counts.kiln > 0 or counts.torch == 0, f"kiln ran the frame eagerly, torch.compile captured {counts.torch}"


def namedtuple_made_inside(a):
    point = collections.namedtuple("Point", ["u", "v"], defaults=[0])
    p = point(a, a + 1)
    return p, p.u * 2, p._replace(u=a), p._asdict(), point(a).v


def test_namedtuple_made_inside_the_function_is_returned_like_eager():
    """Each call makes a new class in eager; kiln makes it once per capture. The instances read the same."""
    expected = namedtuple_made_inside(A)
    compiled = kiln.compile(namedtuple_made_inside, backend="eager")
    got = compiled(A)
    for e, g in ((expected[0], got[0]), (expected[2], got[2])):
        assert type(g).__name__ == type(e).__name__ == "Point" and type(g)._fields == type(e)._fields
        assert type(g).__module__ == type(e).__module__
        assert_same(tuple(e), tuple(g))
    assert_same(expected[1], got[1])
    assert_same(expected[3], got[3])
    assert_same(expected[4], got[4])
    assert graph_count(context_of(compiled)) == 1
    if torch.__version__ >= (2, 13):  # torch 2.11's dynamo fails this program (its side effects assert)
        torch._dynamo.reset()
        counter = GraphCounter()
        torch.compile(namedtuple_made_inside, backend=counter)(A)
        assert counter.count == 1
