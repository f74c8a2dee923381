"""Every mutating method of set, list, dict and deque, compared with eager.

Each case mutates a container built in the frame, and one reached from outside it (an argument), and returns
both the container and what the method returned: a mutation capture drops shows up as a difference.
"""
import collections

import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import assert_same, graph_count

# a capture that fails and runs the frame eagerly would pass on values alone: make it a failure
pytestmark = pytest.mark.filterwarnings("error:kiln. capturing")


def _cases():
    """(name, make the container, the mutation): the mutation returns what the method returned."""
    return [
        ("set.add", lambda: {1, 2, 3}, lambda s: s.add(4)),
        ("set.add_existing", lambda: {1, 2, 3}, lambda s: s.add(True)),
        ("set.discard", lambda: {1, 2, 3}, lambda s: s.discard(1)),
        ("set.discard_missing", lambda: {1, 2, 3}, lambda s: s.discard(9)),
        ("set.remove", lambda: {1, 2, 3}, lambda s: s.remove(2)),
        ("set.pop", lambda: {5, 1, 3}, lambda s: s.pop()),
        ("set.clear", lambda: {1, 2, 3}, lambda s: s.clear()),
        ("set.update", lambda: {1, 2}, lambda s: s.update([3, 4], {5})),
        ("set.difference_update", lambda: {1, 2, 3}, lambda s: s.difference_update([1, 9])),
        ("set.intersection_update", lambda: {1, 2, 3}, lambda s: s.intersection_update({2, 3, 4})),
        ("set.symmetric_difference_update", lambda: {1, 2, 3}, lambda s: s.symmetric_difference_update({3, 4})),
        ("set.ior", lambda: {1, 2}, lambda s: s.__ior__({7})),
        ("set.isub", lambda: {1, 2}, lambda s: s.__isub__({1})),
        ("list.append", lambda: [1, 2], lambda xs: xs.append(3)),
        ("list.insert", lambda: [1, 2], lambda xs: xs.insert(1, 9)),
        ("list.extend", lambda: [1, 2], lambda xs: xs.extend((3, 4))),
        ("list.pop", lambda: [1, 2, 3], lambda xs: xs.pop()),
        ("list.pop_index", lambda: [1, 2, 3], lambda xs: xs.pop(0)),
        ("list.remove", lambda: [1, 2, 1], lambda xs: xs.remove(1)),
        ("list.clear", lambda: [1, 2], lambda xs: xs.clear()),
        ("list.reverse", lambda: [1, 2, 3], lambda xs: xs.reverse()),
        ("list.sort", lambda: [3, 1, 2], lambda xs: xs.sort()),
        ("list.sort_reverse", lambda: [3, 1, 2], lambda xs: xs.sort(reverse=True)),
        ("list.setitem_slice", lambda: [1, 2, 3, 4], lambda xs: xs.__setitem__(slice(1, 3), [9])),
        ("list.delitem", lambda: [1, 2, 3], lambda xs: xs.__delitem__(0)),
        ("list.delitem_slice", lambda: [1, 2, 3, 4], lambda xs: xs.__delitem__(slice(1, 3))),
        ("dict.pop", lambda: {"a": 1, "b": 2}, lambda d: d.pop("a")),
        ("dict.pop_default", lambda: {"a": 1}, lambda d: d.pop("z", 0)),
        ("dict.popitem", lambda: {"a": 1, "b": 2}, lambda d: d.popitem()),
        ("dict.clear", lambda: {"a": 1}, lambda d: d.clear()),
        ("dict.update", lambda: {"a": 1}, lambda d: d.update({"b": 2}, c=3)),
        ("dict.setdefault_new", lambda: {"a": 1}, lambda d: d.setdefault("b", 5)),
        ("dict.setdefault_existing", lambda: {"a": 1}, lambda d: d.setdefault("a", 5)),
        ("dict.delitem", lambda: {"a": 1, "b": 2}, lambda d: d.__delitem__("a")),
        ("dict.setitem", lambda: {"a": 1}, lambda d: d.__setitem__("a", 4)),
        ("deque.append", lambda: collections.deque([1, 2]), lambda q: q.append(3)),
        ("deque.appendleft", lambda: collections.deque([1, 2]), lambda q: q.appendleft(0)),
        ("deque.pop", lambda: collections.deque([1, 2]), lambda q: q.pop()),
        ("deque.popleft", lambda: collections.deque([1, 2]), lambda q: q.popleft()),
        ("deque.extend", lambda: collections.deque([1]), lambda q: q.extend([2, 3])),
        ("deque.rotate", lambda: collections.deque([1, 2, 3]), lambda q: q.rotate(1)),
        ("deque.clear", lambda: collections.deque([1, 2]), lambda q: q.clear()),
        ("deque.extendleft", lambda: collections.deque([1]), lambda q: q.extendleft([2, 3])),
        ("deque.rotate_left", lambda: collections.deque([1, 2, 3]), lambda q: q.rotate(-2)),
        ("deque.maxlen_trims", lambda: collections.deque([1, 2, 3], 3), lambda q: q.append(4)),
        ("deque.maxlen_trims_left", lambda: collections.deque([1, 2, 3], 3), lambda q: q.appendleft(0)),
        ("deque.insert", lambda: collections.deque([1, 2]), lambda q: q.insert(1, 9)),
        ("deque.remove", lambda: collections.deque([1, 2, 1, 3]), lambda q: q.remove(1)),
        ("deque.remove_last", lambda: collections.deque([1, 2, 3]), lambda q: q.remove(3)),
        ("deque.reverse", lambda: collections.deque([1, 2, 3]), lambda q: q.reverse()),
        ("deque.setitem", lambda: collections.deque([1, 2, 3]), lambda q: q.__setitem__(-1, 7)),
        ("deque.delitem", lambda: collections.deque([1, 2, 3]), lambda q: q.__delitem__(0)),
        ("deque.count_index", lambda: collections.deque([1, 2, 1]), lambda q: (q.count(1), q.index(2), q[-1])),
    ]


CASES = _cases()


def _plain(value):
    """The container as a comparable value: sets in their iteration order too (eager's order is the truth)."""
    if isinstance(value, (set, collections.deque)):
        return list(value)
    return value


@pytest.mark.parametrize("make, mutate", [pytest.param(m, f, id=n) for n, m, f in CASES])
def test_mutation_of_a_container_built_in_the_frame(make, mutate):
    def fn(x):
        c = make()
        result = mutate(c)
        return x * len(c), _plain(c), result

    x = torch.ones(2)
    assert_same(fn(x), kiln.compile(fn)(x))


@pytest.mark.parametrize("make, mutate", [pytest.param(m, f, id=n) for n, m, f in CASES])
def test_mutation_of_a_container_from_outside(make, mutate):
    def fn(x, c):
        result = mutate(c)
        return x * len(c), result

    x = torch.ones(2)
    expected_container, actual_container = make(), make()
    expected = fn(x, expected_container)
    assert_same(expected, kiln.compile(fn)(x, actual_container))
    assert _plain(actual_container) == _plain(expected_container)


def test_set_of_tensors_discard_keeps_the_others():
    def fn(a, b):
        s = {a, b}
        s.discard(a)
        return len(s), [v * 2 for v in s]

    a, b = torch.ones(2), torch.zeros(2)
    assert_same(fn(a, b), kiln.compile(fn)(a, b))


def test_set_iteration_order_is_pythons():
    """Iterating a set goes in hash order, not insertion order: `{3, 1, 2}` iterates 1, 2, 3."""
    def fn(x):
        s = {30, 1, 2}
        s.discard(2)
        s.add(17)
        return [x * v for v in s], list(s | {5, 64}), list(s - {1})

    x = torch.ones(2)
    assert_same(fn(x), kiln.compile(fn)(x))


def test_deque_of_tensors_in_one_graph():
    def fn(a, b):
        q = collections.deque([a, b], maxlen=3)
        q.append(a + 1)
        q.appendleft(b + 1)  # full: drops a + 1 from the right
        q.rotate(1)
        try:
            collections.deque().pop()
        except IndexError:
            q.append(a * 3)
        return list(q), q.popleft(), len(q), q.maxlen

    a, b = torch.randn(2), torch.randn(2)
    compiled = kiln.compile(fn, backend="eager")
    assert_same(fn(a, b), compiled(a, b))
    assert graph_count(context_of(compiled)) == 1


def test_set_of_input_tensors_iterates_in_eagers_order():
    def fn(*xs):
        s = set(xs)
        s.discard(xs[0])
        return [v * 1 for v in s]

    xs = [torch.full((2,), float(i)) for i in range(8)]
    assert_same(fn(*xs), kiln.compile(fn, backend="eager")(*xs))
