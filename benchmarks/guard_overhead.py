"""Per-call cost of kiln's guard function on a 12-layer BERT (transformers BertModel, CPU).

Every call of a compiled function first runs its cache entry's guard function
(`GuardSet.compile`), so its time is pure host overhead on each call. This compiles
BertModel(BertConfig()) with the eager backend (the guards come from capture, not the
backend), calls it once, records the (L, G, C) the guard function was called with,
and times that guard function alone: the median of several runs of many calls each.

    PYTHONPATH=. python benchmarks/guard_overhead.py [--runs 7] [--calls 200]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import BertConfig, BertModel

import common  # noqa: F401  (benchmarks run strict: KILN_STRICT=1)
import kiln
from kiln.api import context_of


def compiled_bert():
    """A compiled BertModel, its cache entry, and the (L, G, C) of its first call's guard check."""
    torch.manual_seed(0)
    model = kiln.compile(BertModel(BertConfig()).eval(), backend="eager")
    x = torch.randint(0, 1000, (1, 16))
    with torch.no_grad():
        model(x)
        (frame,) = context_of(model).frames.values()
        (entry,) = frame.entries
        seen = []
        guard = entry.guard
        entry.guard = lambda L, G, C: seen.append((_snapshot(L), G, C)) or guard(L, G, C)
        model(x)
        entry.guard = guard
    return entry, seen[0]


def _snapshot(L: dict) -> dict:
    """`L` as the guard saw it: the program may write into its dicts (transformers adds kwargs)."""
    return {k: dict(v) if type(v) is dict else v for k, v in L.items()}


def time_guard(guard, args: tuple, runs: int, calls: int) -> float:
    """Median over `runs` of the mean microseconds per call of `guard(*args)` (grad mode as compiled)."""
    samples = []
    with torch.no_grad():
        assert guard(*args), "the guards fail on the inputs they were compiled for"
        for _ in range(runs):
            start = time.perf_counter()
            for _ in range(calls):
                guard(*args)
            samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    entry, guard_args = compiled_bert()
    us = time_guard(entry.guard, guard_args, args.runs, args.calls)
    lines = entry.guards.source_code().count("\n        if not (")
    print(f"BERT-12 guards: {len(entry.guards.guards)} installed, {lines} checked per call; "
          f"guard function {us:.1f} us per call (median of {args.runs} x {args.calls} calls)")


if __name__ == "__main__":
    main()
