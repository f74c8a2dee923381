"""Generators as Dynamo's test_generator exercises them: generator functions and expressions consumed inside
compiled code, yield from, send, early exit, generators passed in or returned, and iterator protocol builtins."""
import itertools

import pytest
import torch

from .reference import Table, check, globals_state, t

torch.manual_seed(0)
cases = Table()
A, B = t(4), t(4)
M = t(3, 4)
TRACE = []


def count_up(n):
    for i in range(n):
        yield i


def scaled(xs, k):
    for x in xs:
        yield x * k


def delegating(x):
    yield from count_up(2)
    yield x


def with_return(x):
    yield x
    return 5


def noisy(x):
    TRACE.append("start")
    yield x + 1
    TRACE.append("middle")
    yield x + 2
    TRACE.append("end")


def accumulator():
    total = 0
    while True:
        value = yield total
        total = total + value


@cases((A,))
def generator_in_for(x):
    for i in count_up(3):
        x = x + i
    return x


@cases((A, B))
def generator_over_tensors(a, b):
    return list(scaled([a, b], 2.0))


@cases((A,))
def generator_to_tuple(x):
    return tuple(scaled((x, x + 1), 3))


@cases((A,))
def generator_next_calls(x):
    g = count_up(5)
    first = next(g)
    second = next(g)
    return x + first + second


@cases((A,))
def generator_next_default(x):
    g = count_up(1)
    next(g)
    return x + next(g, 42)


@cases((A,))
def yield_from_generator(x):
    return list(delegating(x))


@cases((A,))
def generator_return_value(x):
    g = with_return(x)
    first = next(g)
    try:
        next(g)
    except StopIteration as stop:
        return first * stop.value
    return first


@cases((A,), state=globals_state(globals(), TRACE=[]))
def generator_side_effects_in_order(x):
    out = []
    for v in noisy(x):
        TRACE.append("body")
        out.append(v)
    return out


@cases((A,), state=globals_state(globals(), TRACE=[]))
def generator_partially_consumed(x):
    g = noisy(x)
    return next(g)


@cases((A,))
def generator_send(x):
    g = accumulator()
    next(g)
    g.send(x)
    return g.send(x * 2)


@cases((A,))
def generator_expression_list(x):
    return list(x * i for i in range(3))


@cases((A, B))
def generator_expression_in_sum(a, b):
    return sum((t * t for t in (a, b)), torch.zeros(4))


@cases((A,))
def generator_expression_any(x):
    return x + any(i > 2 for i in range(5))


@cases((M,))
def generator_in_cat(m):
    return torch.cat(tuple(row * 2 for row in m))


@cases((A,))
def generator_in_dict(x):
    return dict((str(i), x + i) for i in range(2))


@cases((A, B))
def zip_of_generators(a, b):
    return [u + v for u, v in zip(scaled([a, b], 1.0), scaled([b, a], -1.0))]


@cases((A,))
def enumerate_generator(x):
    return [x * i + v for i, v in enumerate(count_up(3))]


@cases((A,))
def generator_early_break(x):
    for i in count_up(100):
        if i == 3:
            break
        x = x * 1.5
    return x


@cases((A,))
def generator_closure_over_tensor(x):
    def shifted(n):
        for i in range(n):
            yield x + i
    return list(shifted(3))


@cases((A,))
def nested_generators(x):
    def outer():
        for i in count_up(2):
            for j in count_up(2):
                yield i * 2 + j
    return x * sum(outer())


@cases((A,))
def generator_with_break_in_body(x):
    out = []
    for v in scaled([x, x + 1], 2.0):
        out.append(v.sum().item())
    return x + out[0]


@cases((A,))
def iter_over_list_with_next(x):
    it = iter([x, x * 2, x * 3])
    a = next(it)
    rest = list(it)
    return a, rest


@cases((A,))
def iter_over_dict(x):
    d = {"a": 1, "b": 2}
    it = iter(d)
    return x + len(next(it)) + d[next(it)]


@cases((A,))
def map_is_lazy_iterator(x):
    m = map(lambda v: v + 1, [1, 2, 3])
    first = next(m)
    return x * first + sum(m)


@cases((A,))
def zip_strict_lengths(x):
    return [a * b for a, b in zip([1, 2, 3], [4, 5, 6], strict=True)] and x * 2


@cases((A,))
def itertools_pairwise(x):
    return [x * (b - a) for a, b in itertools.pairwise([1, 3, 6])]


@cases((A,))
def itertools_repeat_takewhile(x):
    vals = list(itertools.takewhile(lambda v: v < 3, [1, 2, 3, 1]))
    return [x * r for r in itertools.repeat(2, 2)], len(vals)


@cases((A,))
def itertools_groupby(x):
    groups = [(k, len(list(g))) for k, g in itertools.groupby("aabbb")]
    return x * groups[1][1]


@cases((A,))
def iterator_class(x):
    class Countdown:
        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return self

        def __next__(self):
            if self.n == 0:
                raise StopIteration
            self.n -= 1
            return self.n
    return [x + v for v in Countdown(3)]


@cases((A,))
def generator_passed_as_argument_built_inside(x):
    def consume(gen):
        return sum(gen)
    return x * consume(i for i in range(4))


@cases((A,))
def generator_returned(x):
    return list(scaled([x], 2.0))[0], sum(1 for _ in count_up(4))


@cases((A,))
def reversed_range_and_sorted_generator(x):
    return x * sorted(i % 3 for i in range(5))[-1] + next(reversed(range(4)))


def tallies():
    """Counts up; a ValueError thrown in adds ten, and closing it is recorded."""
    n = 0
    try:
        while True:
            try:
                yield n
            except ValueError:
                n += 10
            n += 1
    finally:
        TRACE.append("closed")


@cases((A,), state=globals_state(globals(), TRACE=[]))
def generator_throw_caught_then_close(x):
    g = tallies()
    first = next(g)
    second = g.throw(ValueError)
    third = g.throw(ValueError("again"))
    g.close()
    return x + first + second + third


@cases((A,), state=globals_state(globals(), TRACE=[]))
def generator_throw_uncaught_reaches_caller(x):
    g = tallies()
    next(g)
    try:
        g.throw(KeyError("k"))
    except KeyError:
        x = x + 1
    return x, next(g, "done")


@cases((A,))
def generator_throw_before_start(x):
    g = tallies()
    try:
        g.throw(KeyError)
    except KeyError:
        x = x * 2
    return x, next(g, "done")


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_generator_case_matches_eager(fn, calls, options):
    check(fn, *calls, **options)
