"""Builtins and the standard library as Dynamo's test_functions / test_itertools exercise them: sorted, min and
max with keys and over 0-d tensors, itertools helpers, the operator module, collections' containers, dict(zip),
reversed/sorted iteration, user iterator classes and zip with an infinite generator. Each case must match eager,
capture at most torch.compile's graph count, and never run its frame eagerly where torch.compile captures."""
import collections
import itertools
import operator

import pytest
import torch

from .reference import Table, check, t

torch.manual_seed(0)
cases = Table()
A = t(4)
S0, S1, S2 = t(()), t(()), t(())


# --- sorted, min, max -----------------------------------------------------------------------------

@cases((A,))
def sorted_with_key_and_reverse(a):
    pairs = [(3, a), (1, a * 2), (2, a + 1)]
    by_key = [v for _, v in sorted(pairs, key=lambda p: p[0])]
    return by_key, sorted(pairs, key=operator.itemgetter(0), reverse=True)[0][1], sorted({"b": 1, "a": 2}.items())


@cases((A,))
def sorted_is_stable_in_reverse(a):
    rows = [("x", 1), ("y", 0), ("z", 1)]
    return [name for name, _ in sorted(rows, key=lambda r: r[1], reverse=True)], a + 1


@cases((A,))
def list_sort_with_key(a):
    pairs = [(3, a), (1, a * 2), (2, a + 1)]
    pairs.sort(key=lambda p: -p[0])
    return pairs


@cases((A,))
def min_max_with_key(a):
    pairs = [(3, a), (1, a * 2), (3, a + 1)]
    return max(pairs, key=lambda p: p[0])[1], min(pairs, key=operator.itemgetter(0))[1], max("abc"), min([], default=a)


@cases((S0, S1, S2))
def max_min_of_scalar_tensors(a, b, c):
    return max(a, b, c) * 1, min([a, b, c]) + 0, max(a, b) - min(b, c)


@cases((S0.clone().requires_grad_(), S0.clone().requires_grad_()))
def max_of_tied_tensors_keeps_pythons_gradient(a, b):
    return max(a, b) * 3 + b  # a tie: Python returns a, so all of max's gradient goes to a


@cases((A, A + 1), torch_gives_up="torch.compile returns torch.maximum(a, b) where eager raises")
def max_of_vectors_raises_as_eager(a, b):
    return max(a, b)


@cases((A,))
def empty_max_raises_as_eager(a):
    return a + max([])


# --- itertools ----------------------------------------------------------------------------------------

@cases((A,))
def itertools_accumulate(a):
    return (list(itertools.accumulate([a, a, a])), list(itertools.accumulate([1, 2, 3], operator.mul)),
            list(itertools.accumulate([a, a], initial=a)), list(itertools.accumulate([])))


@cases((A,))
def itertools_zip_longest(a):
    return [p * q for p, q in itertools.zip_longest([a, a], [1], fillvalue=5)], list(itertools.zip_longest("ab", ""))


@cases((A,))
def itertools_groupby(a):
    counted = [a * k * len(list(g)) for k, g in itertools.groupby([1, 1, 2])]
    return counted, [(k, len(list(g))) for k, g in itertools.groupby([1, 3, 2, 4, 5], key=lambda v: v % 2)]


@cases((A,))
def itertools_groupby_skipped_groups(a):
    keys = [k for k, _ in itertools.groupby("aabbbc")]  # groups never consumed: the outer iterator skips them
    return a * len(keys), keys


@cases((A,))
def itertools_chain_product_islice_count_repeat(a):
    out = [a * x + y for x, y in itertools.product([1, 2], [3])]
    out += list(itertools.chain([a], [a + 1])) + list(itertools.chain.from_iterable([[a], [a * 2]]))
    out += [a * i for i in itertools.islice(itertools.count(1), 3)] + list(itertools.repeat(a, 2))
    return out


@cases((A,))
def itertools_pairwise_and_filters(a):
    return ([p - q for p, q in itertools.pairwise([a, a + 1, a + 2])],
            list(itertools.takewhile(lambda v: v < 3, [1, 2, 5, 1])),
            list(itertools.dropwhile(lambda v: v < 3, [1, 2, 5])),
            list(itertools.compress([a, a + 1, a + 2], [1, 0, 1])),
            list(itertools.starmap(operator.add, [(a, 1), (a, 2)])))


# --- operator ----------------------------------------------------------------------------------------

class Node:
    def __init__(self, w):
        self.w, self.child = w, None


@cases((A,))
def operator_getters(a):
    d = {"x": a, "y": a + 1}
    node = Node(a)
    node.child = Node(a * 2)
    return (operator.itemgetter("x", "y")(d), operator.itemgetter(1)([a, a * 2]), operator.attrgetter("w")(node),
            operator.attrgetter("child.w", "w")(node), operator.methodcaller("add", 1)(a),
            operator.methodcaller("mul", other=2)(a))


@cases((A,))
def operator_functions(a):
    return (operator.add(a, 1), operator.mul(a, 2), operator.neg(a), operator.truediv(a, 2), operator.pow(a, 2),
            operator.getitem([a], 0), operator.contains([1], 1), operator.is_(a, a), operator.not_([]),
            operator.truth(1), operator.index(3), operator.matmul(a, a))


@cases((A,))
def operator_setitem_delitem_on_containers_and_tensors(a):
    items = [a, a]
    operator.setitem(items, 0, a * 2)
    operator.delitem(items, 1)
    b = a.clone()
    operator.setitem(b, 0, 5.0)
    return items, b


# --- collections, dict(zip), reversed ------------------------------------------------------------------

@cases((A,))
def collections_containers(a):
    dq = collections.deque([a], maxlen=2)
    dq.append(a + 1)
    dq.appendleft(a + 2)
    od = collections.OrderedDict()
    od["b"], od["a"] = a, a * 2
    od.move_to_end("b")
    dd = collections.defaultdict(list)
    dd["k"].append(a)
    dd["k"].append(a)
    return list(dq), list(od.values()), sum(dd["k"])


@cases((A,))
def dict_of_zip(a):
    d = dict(zip(["a", "b"], [a, a + 1]))
    return d["a"] + d["b"], dict(zip(range(3), "abc")), dict(enumerate([a, a]))


@cases((A,))
def reversed_and_sorted_iteration(a):
    out = a
    for i in reversed(range(3)):
        out = out + i
    for v in reversed([a, a * 2]):
        out = out * v
    for k in sorted({"b": 1, "a": 2}):
        out = out * len(k)
    return out


# --- user iterators, infinite generators ---------------------------------------------------------------

class CountTo:
    """An iterator class: `__iter__` returns self, `__next__` raises StopIteration at the end."""

    def __init__(self, n):
        self.i, self.n = 0, n

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i


class Doubling:
    """An iterable whose iterator is a separate object reading a list the loop body appends to."""

    def __init__(self, seen):
        self.seen = seen

    def __iter__(self):
        return DoublingIterator(self.seen)


class DoublingIterator:
    def __init__(self, seen):
        self.seen = seen

    def __next__(self):
        if len(self.seen) >= 3:
            raise StopIteration
        return len(self.seen) * 2


@cases((A,))
def user_iterator_class(a):
    for i in CountTo(3):
        a = a + i
    return a, list(CountTo(2)), sum(CountTo(4))


@cases((A,))
def user_iterator_stepped_as_the_loop_asks(a):
    seen = []
    for v in Doubling(seen):
        seen.append(a * v)  # each __next__ sees what the body appended before it
    return seen


@cases((A,))
def user_iterator_across_a_break(a):
    it = CountTo(3)
    first = next(it)
    print("break")
    return a * first, [a + i for i in it]


def naturals():
    i = 0
    while True:
        yield i
        i += 1


@cases((A,))
def zip_with_infinite_generator(a):
    return [a * i for i, _ in zip(naturals(), range(3))], list(zip(itertools.count(), "ab"))


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_stdlib_case_matches_eager(fn, calls, options):
    counts = check(fn, *calls, **options)
    assert counts.kiln > 0 or counts.torch == 0 or "torch_gives_up" in options, \
        f"kiln ran the frame eagerly, torch.compile captured {counts.torch}"
