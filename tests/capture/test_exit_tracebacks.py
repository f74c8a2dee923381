"""The traceback a `with` block's `__exit__` gets when the block's body raises inside the captured region.

Eager passes `__exit__` the exception's type, value and a traceback that starts at the frame of the `with`
block. An exception raised by traced code is never raised for real during capture, so it has no traceback
yet: kiln hands `__exit__` a stand-in that answers `tb is None` (False) and `if tb:` and may be passed on
(contextlib's managers hand it to `gen.throw`); where `__exit__` reads it or keeps it, the break moves to the
raise, which then runs natively and gives `__exit__` eager's traceback. `e.__traceback__` in a traced `except`
is the same stand-in. Each case compares with eager; graph counts are compared with torch.compile's,
measured here, where torch.compile computes what eager computes.
"""
import contextlib
import traceback

import torch
import torch._dynamo

import kiln
from kiln.api import context_of
from support.capture import CountingBackend, assert_same, graph_count

SEEN = []


class Recording:
    """Records what its `__exit__` gets, as the names of the traceback's frames, and suppresses the error."""

    def __enter__(self):
        return self

    def __exit__(self, typ, value, tb):
        SEEN.append((typ, type(value), tb is None, [f.name for f in traceback.extract_tb(tb)] if tb else None))
        return True


class SuppressesOnlyInItsCaller:
    """Suppresses an error raised directly in the frame of the `with` block, read from the traceback."""

    def __enter__(self):
        return self

    def __exit__(self, typ, value, tb):
        return tb is not None and tb.tb_frame.f_code.co_name == "raises_in_the_block_it_checks"


class Keeps:
    """Keeps the traceback for later and suppresses the error."""

    def __enter__(self):
        return self

    def __exit__(self, typ, value, tb):
        self.tb = tb
        return True


def raises_in_a_recorded_block(x):
    y = x + 1
    with Recording():
        y = y * 2
        raise ValueError("boom")
    return y


def _raise_key_error():
    raise KeyError("k")


def raises_in_a_helper_inside_the_block(x):
    with Recording():
        x = x * 2
        _raise_key_error()
    return x + 1


def raises_in_the_block_it_checks(x):
    with SuppressesOnlyInItsCaller():
        x = x * 2
        raise ValueError
    return x + 1


def keeps_the_traceback(x):
    manager = Keeps()
    with manager:
        x = x * 2
        raise ValueError
    return x + 1, manager.tb is not None, manager.tb.tb_frame.f_code.co_name


def _caught_error_has_a_traceback():
    try:
        raise KeyError("z")
    except KeyError as e:
        return e.__traceback__ is not None


def _line_of_a_caught_error():
    try:
        raise KeyError("z")
    except KeyError as e:
        return e.__traceback__.tb_lineno - _line_of_a_caught_error.__code__.co_firstlineno


def keeps_the_traceback_then_breaks(x):
    manager = Keeps()
    with manager:
        x = x * 2
        raise ValueError
    torch._dynamo.graph_break()
    return x + 1, manager.tb.tb_frame.f_code.co_name


def reads_the_traceback_of_a_caught_error(x):
    return x + 1, _caught_error_has_a_traceback(), _line_of_a_caught_error()


@contextlib.contextmanager
def swallowing():
    try:
        yield
    except ValueError:
        pass


def raises_in_a_generator_manager(x):
    with swallowing():
        x = x * 2
        raise ValueError
    return x + 1


def raises_in_suppress(x):
    with contextlib.suppress(ValueError):
        x = x * 2
        raise ValueError
    return x + 1


def _run(compiled, x):
    SEEN.clear()
    return compiled(x.clone()), list(SEEN)


def _kiln_and_torch_graphs(fn, x) -> tuple[int, int]:
    """kiln's graphs for one call (its values equal to eager's, what `__exit__` got included) and torch.compile's."""
    expected = _run(fn, x)
    kiln.reset()
    compiled = kiln.compile(fn, backend="eager")
    assert_same(expected, _run(compiled, x))
    torch._dynamo.reset()
    counter = CountingBackend()
    torch.compile(fn, backend=counter)(x.clone())
    return graph_count(context_of(compiled)), counter.graphs


def test_exit_gets_the_traceback_eager_gives_in_no_more_graphs_than_torch():
    kiln_graphs, torch_graphs = _kiln_and_torch_graphs(raises_in_a_recorded_block, torch.randn(3))
    # torch 2.11's torch.compile runs this frame eagerly whole (no graph), 2.13's captures the block's one graph
    assert kiln_graphs <= max(torch_graphs, 1), (kiln_graphs, torch_graphs)


def test_exit_reading_its_traceback_decides_as_in_eager():
    """Reading `tb.tb_frame` says the error came from the frame of the block: suppressed, as in eager."""
    x = torch.randn(3)
    compiled = kiln.compile(raises_in_the_block_it_checks, backend="eager")
    assert_same(raises_in_the_block_it_checks(x), compiled(x))


def test_an_error_from_a_helper_gets_a_traceback_through_the_helper():
    x = torch.randn(3)
    expected = _run(raises_in_a_helper_inside_the_block, x)
    out, seen = _run(kiln.compile(raises_in_a_helper_inside_the_block, backend="eager"), x)
    assert_same(expected[0], out)
    [(typ, value_type, tb_is_none, frames)] = seen
    assert (typ, value_type, tb_is_none) == (KeyError, KeyError, False)
    assert frames[0] == "raises_in_a_helper_inside_the_block" and frames[-1] == "_raise_key_error", frames


def test_a_traceback_kept_by_exit_is_the_real_one():
    x = torch.randn(3)
    assert_same(keeps_the_traceback(x), kiln.compile(keeps_the_traceback, backend="eager")(x))


def test_a_traceback_kept_before_a_later_break_is_the_real_one():
    """The later break was chosen first; the kept traceback moves it to the raise, before it."""
    x = torch.randn(3)
    assert_same(keeps_the_traceback_then_breaks(x), kiln.compile(keeps_the_traceback_then_breaks, backend="eager")(x))


def test_the_traceback_of_an_error_caught_in_traced_code():
    """`e.__traceback__` in a traced `except` is not None; reading its line runs the helper natively."""
    x = torch.randn(3)
    expected = reads_the_traceback_of_a_caught_error(x)
    compiled = kiln.compile(reads_the_traceback_of_a_caught_error, backend="eager")
    assert_same(expected, compiled(x))
    assert expected[1:] == (True, 2)


def test_contextlib_managers_stay_in_one_graph_as_under_torch_compile():
    """contextlib's managers hand the traceback on (`gen.throw`, `exc.__traceback__ = tb`) without reading it."""
    for fn in (raises_in_a_generator_manager, raises_in_suppress):
        kiln_graphs, torch_graphs = _kiln_and_torch_graphs(fn, torch.randn(3))
        assert kiln_graphs == 1 and kiln_graphs <= torch_graphs, (fn.__name__, kiln_graphs, torch_graphs)
