"""Resuming after a graph break with closure cells: nested functions defined after the break (recursive ones
too), closures made before the break that read variables assigned after it, comprehensions after it; and
capture failures that must not leave a frame eager for good (an input's rank changing under automatic dynamic).

Each case runs eagerly and compiled (backend="eager") on the same inputs; `graphs` is the count torch.compile
gives on the same function."""
import warnings

import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import check, graph_count, t


def recursive_nested_after_break(x):
    y = x + 1
    print("", end="")

    def h(n):
        return 1 if n <= 1 else n * h(n - 1)

    return y * h(3)


def recursive_nested_before_break(x):
    def h(n):
        return 1 if n <= 1 else n * h(n - 1)

    y = x * h(2)
    print("", end="")
    return y * h(4)


def recursive_lambda_after_break(x):
    print("", end="")
    fib = lambda n: n if n < 2 else fib(n - 1) + fib(n - 2)  # noqa: E731
    return x * fib(6)


def mutually_recursive_after_break(x):
    print("", end="")

    def even(n):
        return True if n == 0 else odd(n - 1)

    def odd(n):
        return False if n == 0 else even(n - 1)

    return x + (1 if even(4) else 0) + (10 if odd(3) else 0)


def closure_before_break_reads_variable_assigned_after(x):
    def g():
        return k * x

    print("", end="")
    k = 3
    return g()


def closure_sees_rebinding_after_break(x):
    k = 2

    def g():
        return k * x

    print("", end="")
    k = 5
    return g()


def closure_after_break_captures_variable_from_before(x):
    a = x + 1
    print("", end="")

    def g(v):
        return v * a

    return g(x)


def nested_closure_factory_after_break(x):
    print("", end="")

    def outer():
        a = x + 1

        def inner():
            return a * 2

        return inner

    return outer()()


def nonlocal_counter_after_break(x):
    acc = 0

    def add(v):
        nonlocal acc
        acc += v

    print("", end="")
    add(1)
    add(2)
    return x * acc


def comprehensions_after_break(x):
    ys = [x * i for i in range(3)]
    print("", end="")
    zs = [y + j for j, y in enumerate(ys)]
    d = {i: z for i, z in enumerate(zs)}
    s = sum(z.sum() for z in zs)
    return d[2] + s


def comprehension_with_closure_after_break(x):
    print("", end="")
    scale = 2
    fs = [lambda v, i=i: v * i * scale for i in range(3)]
    return sum(f(x) for f in fs)


def returns_the_recursive_function(x):
    print("", end="")

    def h(n):
        return 1 if n <= 1 else n * h(n - 1)

    return x * 2, h


@pytest.mark.parametrize("fn, graphs", [
    (recursive_nested_after_break, 2),
    (recursive_nested_before_break, 2),
    (recursive_lambda_after_break, 1),
    (mutually_recursive_after_break, 1),
    (closure_before_break_reads_variable_assigned_after, 1),
    (closure_sees_rebinding_after_break, 1),
    (closure_after_break_captures_variable_from_before, 2),
    (nested_closure_factory_after_break, 1),
    (nonlocal_counter_after_break, 1),
    (comprehensions_after_break, 2),
    (comprehension_with_closure_after_break, 1),
], ids=lambda v: getattr(v, "__name__", str(v)))
def test_cells_after_a_break(fn, graphs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no capture may fail and fall back
        check(fn, t(3), graphs=graphs)


def test_a_recursive_function_made_after_a_break_escapes_as_one_working_function():
    x = t(3)
    out, h = kiln.compile(returns_the_recursive_function, backend="eager")(x)
    assert torch.equal(out, x * 2)
    assert h(5) == 120
    assert h.__closure__[0].cell_contents is h  # the cell holds the very function returned


def sum_last(x):
    return x.sum(-1) * 2


@pytest.mark.parametrize("shapes", [
    [(3, 4), (3, 5), (5,)],  # dimension 1 became dynamic, then the input has no dimension 1
    [(3, 4), (5, 4), (2, 3, 5), (6,)],
    [(2, 3, 4), (2, 3, 5), (4, 6), (7,), (2, 2, 2, 2)],
], ids=["2d-to-1d", "2d-3d-1d", "3d-2d-1d-4d"])
def test_changing_an_inputs_rank_recompiles(shapes):
    compiled = kiln.compile(sum_last, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for shape in shapes:
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), sum_last(x))
    assert graph_count(context_of(compiled)) >= len(shapes) - 1  # compiled, not eager


def test_rank_change_under_dynamic_true_recompiles():
    compiled = kiln.compile(sum_last, backend="eager", dynamic=True)
    for shape in [(3, 4), (5,), (2, 3, 4)]:
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), sum_last(x))
    assert graph_count(context_of(compiled)) == 3


_fail = {"on": True}


@pytest.mark.allows_fallback('frame: capture is broken on purpose')
def test_a_failed_capture_runs_eagerly_once_and_later_calls_compile_again(monkeypatch):
    from kiln.capture import entry

    real_capture = entry.capture

    def flaky(*args, **kwargs):
        if _fail["on"]:
            raise RuntimeError("injected capture failure")
        return real_capture(*args, **kwargs)

    monkeypatch.setattr(entry, "capture", flaky)
    compiled = kiln.compile(sum_last, backend="eager")
    x = torch.randn(3, 4)
    with pytest.warns(UserWarning, match="injected capture failure"):
        torch.testing.assert_close(compiled(x), sum_last(x))
    _fail["on"] = False
    try:
        torch.testing.assert_close(compiled(x), sum_last(x))
    finally:
        _fail["on"] = True
    assert graph_count(context_of(compiled)) == 1


@pytest.mark.allows_fallback('frame: capture is broken on purpose')
def test_a_capture_failing_every_time_runs_eagerly_for_good_after_the_cache_limit(monkeypatch):
    from kiln.capture import entry
    from kiln.config import config

    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("injected capture failure")

    monkeypatch.setattr(entry, "capture", failing)
    compiled = kiln.compile(sum_last, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(config.cache_size_limit + 3):
            x = torch.randn(3, 4)
            torch.testing.assert_close(compiled(x), sum_last(x))
    assert len(calls) == config.cache_size_limit
    assert sum("injected" in str(w.message) for w in caught) == 1  # warned once


def break_in_try(x, flag):
    try:
        y = x + 1
        if flag:
            print("", end="")
        return y * 2
    except ValueError:
        return x


def test_an_unresumable_break_runs_eagerly_only_for_inputs_that_reach_it():
    compiled = kiln.compile(break_in_try, backend="eager")
    x = t(3)
    torch.testing.assert_close(compiled(x, True), break_in_try(x, True))  # a break in a try: eager
    torch.testing.assert_close(compiled(x, False), break_in_try(x, False))  # no break on this path: compiled
    torch.testing.assert_close(compiled(x, True), break_in_try(x, True))
    ctx = context_of(compiled)
    assert graph_count(ctx) == 1
    assert len(ctx.records) == 1


def builds_from_inputs_after_a_break(x, k, v, flag):
    print("", end="")
    d = {k: v}
    s = {k, v}
    same = k is flag
    return x * 2, d, s, same, +v, tuple([k, v])


def test_a_continuation_past_its_cache_limit_folds_nothing_about_its_inputs(monkeypatch):
    """Past the limit a continuation steps natively with unguarded inputs: a dict or set built from
    them, or `is` on them, runs natively each call (it was folded once, or could not resume)."""
    from kiln.config import config

    monkeypatch.setattr(config, "cache_size_limit", 1)
    compiled = kiln.compile(builds_from_inputs_after_a_break, backend="eager")
    for args in [(t(2), "a", 1, None), (t(2), "b", 2, "b"), (t(2), "c", 3, None), (t(3), 5, 4, 5)]:
        got, expected = compiled(*args), builds_from_inputs_after_a_break(*args)
        torch.testing.assert_close(got[0], expected[0])
        assert got[1:] == expected[1:]
