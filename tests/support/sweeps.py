"""On-demand sweeps: CI runs a fixed sample of each large test matrix, the whole matrix runs on demand.

CI has two cores and ten minutes, so a matrix of many near-identical cases (seed lists, model x optimizer
products, interpreter runs of every reduction shape) runs a deterministic sample spread over its classes: every
class keeps a case in CI, and every machine runs the same cases. Each sweep has its own switch (named in its test
module's docstring and in README's testing section); a parametrized test marked `@pytest.mark.sampled(every,
classes)` is sampled by `diagonal` (tests/conftest.py), all of them whole under KILN_MATRIX_SWEEP=1. A case named
by its id on the command line runs, sampled or not. `KILN_FULL_TESTS=1` turns every switch on:

    KILN_FULL_TESTS=1 bash scripts/test.sh
"""
from __future__ import annotations

import os

FULL_TESTS = "KILN_FULL_TESTS"


def full(switch: str, value: str | None = None) -> bool:
    """Whether the sweep behind `switch` runs whole: KILN_FULL_TESTS=1, or the sweep's own variable set (to
    `value` where the switch takes a value, e.g. HF_ZOO=all; else to anything non-empty)."""
    if os.environ.get(FULL_TESTS) == "1":
        return True
    own = os.environ.get(switch, "")
    return own == value if value is not None else bool(own)


MATRIX_SWEEP = "KILN_MATRIX_SWEEP"


def diagonal(cases: list[dict[str, int]], every: int, classes: tuple[str, ...]) -> list[int]:
    """CI's sample of one parametrized test's matrix: the indices of the `cases` (each case its position along every
    axis of the matrix) to run. A case runs when its positions sum to a multiple of `every`: a diagonal through the
    matrix that keeps about one case in `every`, spread so that every value of an axis meets different values of the
    others. Each value of a `classes` axis (the behaviours the test is about: an op, a layout, a dtype family) keeps
    at least one case: where the diagonal misses one, its first case runs as well."""
    kept = [i for i, case in enumerate(cases) if sum(case.values()) % every == 0]
    for axis in classes:
        covered = {cases[i][axis] for i in kept}
        for i, case in enumerate(cases):
            if case[axis] not in covered:
                covered.add(case[axis])
                kept.append(i)
    return sorted(kept)
