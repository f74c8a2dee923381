"""On-demand sweeps: CI runs a fixed sample of each large test matrix, the whole matrix runs on demand.

CI has two cores and ten minutes, so a matrix of many near-identical cases (seed lists, model x optimizer
products, interpreter runs of every reduction shape) runs a deterministic sample spread over its classes: every
class keeps a case in CI, and a run prints the same cases on every machine. Each sweep has its own switch (named
in its test module's docstring and in README's testing section); `KILN_FULL_TESTS=1` turns every one on:

    KILN_FULL_TESTS=1 bash scripts/test.sh
"""
from __future__ import annotations

import os
from collections.abc import Sequence

FULL_TESTS = "KILN_FULL_TESTS"


def full(switch: str, value: str | None = None) -> bool:
    """Whether the sweep behind `switch` runs whole: KILN_FULL_TESTS=1, or the sweep's own variable set (to
    `value` where the switch takes a value, e.g. HF_ZOO=all; else to anything non-empty)."""
    if os.environ.get(FULL_TESTS) == "1":
        return True
    own = os.environ.get(switch, "")
    return own == value if value is not None else bool(own)


def spread(cases: Sequence, count: int) -> list:
    """`count` cases evenly spaced over `cases`, first and last included: lists ordered by class (seeds of one
    generator feature after another, one op's dtypes after another's) keep a case of each stretch."""
    cases = list(cases)
    if count >= len(cases):
        return cases
    if count <= 1:
        return cases[:count]
    step = (len(cases) - 1) / (count - 1)
    return [cases[round(i * step)] for i in range(count)]


def sampled(switch: str, cases: Sequence, count: int) -> list:
    """Every case when the sweep behind `switch` runs whole (see `full`), else `spread(cases, count)`."""
    return list(cases) if full(switch) else spread(cases, count)
