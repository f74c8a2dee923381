"""A symbolic size that the guards pin to one value is that value in the lowering (fuzz seed 12357).

`a[::3]` of an `a` with s0 rows has ((s0 + 2)//3) rows. The capture guards 2 <= s0 <= 3 when the graph
broadcasts those rows against `a`'s (eager can only broadcast one row), so the size is 1 on every call
the graph runs for. Read as a symbol, the broadcast indexed `a[::3]` at row i, past its end: wrong values
read out of bounds. Each case runs eagerly and compiled over the sizes that make its graph dynamic.
"""
from __future__ import annotations

import pytest
import torch

import kiln


def every_third_row_over_all(a):
    return a[::3] / a, (a[::3] > 0) & (a > 1)


def every_third_column_times_all(a):
    return a[:, ::3] * a + 1


def where_between_pinned_and_full(a):
    return torch.where(a > 2, a[::3], a * 2)


def pinned_row_in_a_reduction(a):
    return (a[::3] - a).sum(0), (a[::3] * a).amax(1)


def compare_over_sizes(fn, dynamic) -> None:
    compiled = kiln.compile(fn, dynamic=dynamic)
    for rows, cols in ((2, 3), (3, 2), (2, 4)):
        a = torch.arange(rows * cols).reshape(rows, cols) - 3
        if fn is every_third_column_times_all:
            a = a.t().contiguous()
        expected, got = fn(a), compiled(a)
        for e, g in zip(expected if isinstance(expected, tuple) else (expected,),
                        got if isinstance(got, tuple) else (got,)):
            torch.testing.assert_close(g, e, equal_nan=True)


@pytest.mark.parametrize("fn", [every_third_row_over_all, every_third_column_times_all,
                                where_between_pinned_and_full, pinned_row_in_a_reduction], ids=lambda f: f.__name__)
def test_a_size_pinned_to_one_broadcasts(fn):
    """The default `dynamic=None`: the second size makes both dims symbols."""
    compare_over_sizes(fn, None)


def test_a_size_pinned_to_one_broadcasts_when_dynamic_from_the_start():
    compare_over_sizes(every_third_row_over_all, True)


def half_the_rows_against_all(a):
    """`round(s0 / 2)` rows: 1 for two rows, a size its ranges leave open but the broadcast's guard proves."""
    half = a[:round(a.shape[0] / 2)]
    return half == a, half * a


def all_but_the_last_row_against_all(a):
    return a[:a.shape[0] - 1] - a, (a[a.shape[0] // 2:] + a).sum(0)


@pytest.mark.parametrize("fn", [half_the_rows_against_all, all_but_the_last_row_against_all],
                         ids=lambda f: f.__name__)
def test_a_size_the_guards_prove_one_broadcasts(fn):
    """(fuzz seed 840789) A derived size that is 1 at the traced sizes, where the broadcast guarded it is 1: read
    as a symbol, the broadcast read row i of it, and `half == a` compared `a` with itself."""
    compiled = kiln.compile(fn, dynamic=True)
    a = torch.tensor([[0, 1, 0], [0, 1, 1]])
    expected, got = fn(a), compiled(a)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)
