"""On-demand sweeps: CI runs a fixed sample of each large test matrix, the whole matrix runs on demand.

CI has two cores and ten minutes, so a matrix of many near-identical cases (seed lists, model x optimizer
products, interpreter runs of every reduction shape) runs a deterministic sample spread over its classes: every
class keeps a case in CI, and every machine runs the same cases. Each sweep has its own switch (named in its test
module's docstring and in README's testing section); `KILN_FULL_TESTS=1` turns every one on:

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
