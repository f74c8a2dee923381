"""Iterators are lazy, as in Python: a generator runs to its next `yield` per next(), `map` calls its
function per item, `zip(it, it)` pairs consecutive items; and a graph break inside a loop resumes the
loop's iterator at its exact position. Each case compares outputs and the order of side effects with eager."""
import itertools

import pytest
import torch

import kiln
from support.capture import assert_same

TRACE = []


def noisy(x):
    TRACE.append("start")
    yield x
    TRACE.append("middle")
    yield x * 2
    TRACE.append("end")


def scaled(xs, k):
    for x in xs:
        TRACE.append(k)
        yield x * k


def with_return(x):
    yield x
    return 3


def accumulator():
    total = 0
    while True:
        value = yield total
        total = total + value


def delegating(x):
    result = yield from with_return(x)
    yield x * result


def loop_over_generator(x):
    out = []
    for v in noisy(x):
        TRACE.append("body")
        out.append(v)
    return out


def partially_consumed(x):
    return next(noisy(x))


def generator_send(x):
    g = accumulator()
    next(g)
    g.send(x)
    return g.send(x * 2)


def return_value_through_stop_iteration(x):
    g = with_return(x)
    first = next(g)
    try:
        next(g)
    except StopIteration as stop:
        return first * stop.value
    return first


def yield_from_return_value(x):
    return list(delegating(x))


def zip_of_one_iterator_twice(x):
    it = iter([x, x + 1, x + 2, x + 3])
    return [a - b for a, b in zip(it, it)]


def map_calls_per_item(x):
    m = map(lambda v: (TRACE.append("map"), v * 2)[1], [x, x + 1])
    first = next(m)
    TRACE.append("between")
    return first, list(m)


def filter_and_enumerate_of_generators(x):
    kept = list(filter(lambda v: v.sum() > 0, scaled([x, -x, x], 1.0)))
    TRACE.append("between")
    return kept, [(i, v) for i, v in enumerate(scaled([x, x], 2.0), 5)]


def zip_of_generators_interleaves(x):
    return [a + b for a, b in zip(scaled([x, x], 1.0), scaled([x, x], 2.0))]


def generator_left_unfinished(x):
    for v in noisy(x):
        return v * 3


def endless(x):
    i = 0
    while True:
        TRACE.append(i)
        yield x * i
        i += 1


def islice_of_an_endless_generator(x):
    it = itertools.islice(endless(x), 1, 6, 2)
    first = next(it)
    TRACE.append("between")
    return first, list(it)


def any_and_all_stop_early(x):
    found = any(TRACE.append(i) or i > 1 for i in range(5))
    every = all(TRACE.append(-i) or i < 1 for i in range(5))
    return x * found, every


def chain_is_lazy(x):
    c = itertools.chain([x], scaled([x, x], 2.0), scaled([x], 3.0))
    first = next(c)
    TRACE.append("between")
    return first, list(c)


def itertools_endless_and_lazy(x):
    counted = [x + n for n in itertools.islice(itertools.count(5, 2), 3)]
    repeated = list(itertools.repeat(x, 2))
    taken = list(itertools.takewhile(lambda v: TRACE.append(v) or v < 3, [1, 2, 3, 1]))
    dropped = list(itertools.dropwhile(lambda v: TRACE.append(-v) or v < 3, [1, 3, 1]))
    pairs = [b - a for a, b in itertools.pairwise(scaled([x, x + 1, x + 3], 1.0))]
    return counted, repeated, taken, dropped, pairs


def itertools_combinatorics(x):
    return ([a * b for a, b in itertools.combinations([x, x + 1, x + 2], 2)],
            [(i, j) for i, j in itertools.permutations(range(3), 2)])


def membership_stops_consuming_at_the_match(x):
    g = scaled([1, 2, 3, 4], 1)
    found = 2 in g
    return x * found, list(g)


def iter_of_iterator_shares_position(x):
    it = iter([x, x * 2, x * 3])
    same = iter(it)
    next(same)
    return list(it)


CASES = [loop_over_generator, partially_consumed, generator_send, return_value_through_stop_iteration,
         yield_from_return_value, zip_of_one_iterator_twice, map_calls_per_item,
         filter_and_enumerate_of_generators, zip_of_generators_interleaves, generator_left_unfinished,
         islice_of_an_endless_generator, any_and_all_stop_early, chain_is_lazy, itertools_endless_and_lazy,
         itertools_combinatorics, membership_stops_consuming_at_the_match, iter_of_iterator_shares_position]


def _run(fn, x):
    TRACE.clear()
    out = fn(x)
    return out, list(TRACE)


@pytest.mark.parametrize("fn", CASES, ids=lambda f: f.__name__)
def test_iterator_matches_eager_with_side_effects_in_order(fn):
    x = torch.randn(3)
    expected, expected_trace = _run(fn, x)
    actual, actual_trace = _run(kiln.compile(fn, backend="eager"), x)
    assert_same(expected, actual)
    assert actual_trace == expected_trace


# A graph break (`.item()`) in the body of a loop: the continuation resumes the iterator at its position.

def break_in_loop_over_generator(x):
    return [v.sum().item() for v in scaled([x, x + 1], 2.0)]


def break_in_loop_over_zip(x):
    return [(a + b).sum().item() for a, b in zip([x, x + 1, x + 2], (x, x * 2, x * 3))]


def break_in_loop_over_enumerate(x):
    out = []
    for i, v in enumerate([x, x + 1, x + 2], 1):
        out.append(i * v.sum().item())
    return out


def break_in_loop_over_map(x):
    out = []
    for v in map(lambda t: t * 2, [x, x + 1, x + 2]):
        out.append(v.sum().item())
    return out


def break_in_loop_over_filter(x):
    out = []
    for v in filter(lambda t: True, [x, x + 1, x + 2]):
        out.append(v.sum().item())
    return out


def break_in_loop_over_dict_items(x):
    out = []
    for k, v in {"a": x, "b": x + 1, "c": x + 2}.items():
        out.append((k, v.sum().item()))
    return out


def break_in_loop_over_islice_and_chain(x):
    out = []
    for v in itertools.islice(itertools.chain([x], [x + 1, x + 2, x + 3]), 1, None, 2):
        out.append(v.sum().item())
    return out


def break_in_loop_over_pairwise_and_takewhile(x):
    out = []
    for a, b in itertools.pairwise(itertools.takewhile(lambda v: v.sum() < 100, [x, x + 1, x + 2, x + 3])):
        out.append((b - a).sum().item())
    return out


def break_in_loop_over_count(x):
    out = []
    for n in itertools.count(1):
        out.append(n * x.sum().item())
        if n == 3:
            break
    return out


def break_in_loop_over_range_and_list_iterator(x):
    out = []
    it = iter([x, x + 1, x + 2])
    for i in range(3):
        out.append(i + next(it).sum().item())
    return out


BREAK_CASES = [break_in_loop_over_generator, break_in_loop_over_zip, break_in_loop_over_enumerate,
               break_in_loop_over_map, break_in_loop_over_filter, break_in_loop_over_dict_items,
               break_in_loop_over_islice_and_chain, break_in_loop_over_pairwise_and_takewhile, break_in_loop_over_count,
               break_in_loop_over_range_and_list_iterator]


@pytest.mark.parametrize("fn", BREAK_CASES, ids=lambda f: f.__name__)
def test_graph_break_in_a_loop_keeps_the_iterator_position(fn):
    x = torch.randn(3)
    expected, expected_trace = _run(fn, x)
    actual, actual_trace = _run(kiln.compile(fn, backend="eager"), x)
    assert_same(expected, actual)
    assert actual_trace == expected_trace
