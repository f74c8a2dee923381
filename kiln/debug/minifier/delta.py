"""The minifier's search: smaller and smaller graphs that still fail the same way, until none is found or time is up.

Each round tries, in order, the reductions of kiln/debug/minifier/graphs.py and keeps a candidate only when it
fails like the original (`Checker.fails_like`):

    truncate      the shortest prefix of the graph that still fails (bisection over the compute nodes)
    outputs       one output instead of several
    inputs        a chunk of nodes replaced by placeholders fed their eager values: halves, quarters, ... single
                  nodes (delta debugging), so what only feeds the failing op goes
    bypass        one node removed, its users reading its input of the same shape and dtype
    shrink        every tensor input sliced to size 1 at once, else to half its size, then one input at a time

Rounds repeat while one of them made the graph smaller. Each kept step is reported (`progress`); past
`deadline` the search stops and returns the smallest failing case found so far.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kiln.debug.minifier.check import Checker, Outcome
from kiln.debug.minifier.graphs import Case


class OutOfTime(Exception):
    """The search's time limit passed."""


@dataclass
class Search:
    checker: Checker
    failure: Outcome
    deadline: float
    progress: Callable[[str], None]
    best: Case | None = None
    checks: int = 0
    steps: list[str] = field(default_factory=list)

    def fails(self, case: Case | None) -> bool:
        if case is None:
            return False
        if time.monotonic() > self.deadline:
            raise OutOfTime
        self.checks += 1
        return self.checker.fails_like(case, self.failure)

    def keep(self, case: Case, step: str) -> Case:
        before = self.best.size if self.best is not None else None
        self.best = case
        nodes, numel = case.size
        self.steps.append(step)
        if before is not None:
            self.progress(f"{step}: {before[0]} -> {nodes} compute nodes, {before[1]} -> {numel} input elements "
                          f"({self.checks} checks)")
        return case


def minify(case: Case, checker: Checker, failure: Outcome, time_limit: float,
           progress: Callable[[str], None]) -> tuple[Case, bool]:
    """The smallest failing case found, and whether the search finished (False: it ran out of time)."""
    search = Search(checker, failure, time.monotonic() + time_limit, progress)
    search.keep(case, "start")
    progress(f"start: {case.size[0]} compute nodes, {case.size[1]} input elements; failure: {failure.kind} "
             f"({failure.detail})")
    try:
        while True:
            before = search.best.size
            for reduction in (_truncate, _outputs, _inputs, _bypass, _shrink):
                reduction(search)
            if search.best.size >= before:
                return search.best, True
    except OutOfTime:
        progress(f"time limit ({time_limit:.0f} s) reached: keeping the smallest failing graph so far")
        return search.best, False


def _truncate(search: Search) -> None:
    case = search.best
    lo, hi = 1, len(case.compute_nodes)
    found = None
    while lo < hi:
        mid = (lo + hi) // 2
        candidate = _try(case.truncated, mid)
        if search.fails(candidate):
            hi, found = mid, candidate
        else:
            lo = mid + 1
    if found is not None and found.size < case.size:
        search.keep(found, "truncate")


def _outputs(search: Search) -> None:
    outputs = search.best.outputs()
    if len(outputs) < 2:
        return
    for out in outputs:
        candidate = _try(search.best.rebuild, [out])
        if search.fails(candidate):
            search.keep(candidate, "outputs")
            return


def _inputs(search: Search) -> None:
    chunk = max(1, len(search.best.compute_nodes) // 2)
    while True:
        start = 0
        while start < len(search.best.compute_nodes):
            case = search.best
            nodes = set(case.compute_nodes[start:start + chunk]) - set(case.outputs())
            candidate = _try(case.rebuild, case.outputs(), nodes) if nodes else None
            if candidate is not None and candidate.size < case.size and search.fails(candidate):
                search.keep(candidate, "inputs")  # the same start now names later nodes
            else:
                start += chunk
        if chunk == 1:
            return
        chunk = max(1, chunk // 2)


def _bypass(search: Search) -> None:
    index = 0
    while index < len(search.best.compute_nodes):
        candidate = _try(search.best.bypassed, search.best.compute_nodes[index])
        if search.fails(candidate):
            search.keep(candidate, "bypass")
        else:
            index += 1


def _shrink(search: Search) -> None:
    if search.fails(candidate := _try(search.best.shrunk, None, True)):  # one check where size does not matter
        search.keep(candidate, "shrink")
        return
    while search.fails(candidate := _try(search.best.shrunk)):
        search.keep(candidate, "shrink")
    for i in range(len(search.best.inputs)):
        while search.fails(candidate := _try(search.best.shrunk, {i})):
            search.keep(candidate, "shrink")


def _try(make: Callable, *args) -> Case | None:
    """A candidate, or None where building it fails (a node eager cannot run on its new inputs)."""
    try:
        return make(*args)
    except Exception:  # noqa: BLE001  (a candidate that cannot be built is simply not taken)
        return None
