"""Test-only switches that break kiln's code generator on purpose, for the minifier's tests.

    mul_as_add()       kiln's lowering of aten.mul computes an add: a silent wrong answer (an accuracy failure)
    sigmoid_raises()   kiln's lowering of aten.sigmoid raises: the graph falls back to ATen (a crash, to the minifier)

`python -m tests.debug.miscompile mul_as_add script.py` runs a script with the switch on, as a repro script
would be run by a user whose kiln has that bug.
"""
from __future__ import annotations

import contextlib
import runpy
import sys

import torch

from kiln.lower.ops import LOWERINGS

aten = torch.ops.aten


@contextlib.contextmanager
def mul_as_add():
    add = LOWERINGS[aten.add.Tensor]
    with _replaced(aten.mul.Tensor, lambda ctx, meta, a, b: add(ctx, meta, a, b)):
        yield


@contextlib.contextmanager
def sigmoid_raises():
    def broken(ctx, meta, *args, **kwargs):
        raise TypeError("injected: the sigmoid lowering is broken")

    with _replaced(aten.sigmoid.default, broken):
        yield


@contextlib.contextmanager
def _replaced(op, rule):
    original = LOWERINGS[op]
    LOWERINGS[op] = rule
    try:
        yield
    finally:
        LOWERINGS[op] = original


if __name__ == "__main__":
    switch, script = sys.argv[1], sys.argv[2]
    sys.argv = [script]
    with globals()[switch]():
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            sys.exit(e.code)
