"""Does a graph still fail? The minifier's one question, asked of every candidate.

A failure is where it happened (`after`: "capture", the FX graph a backend was given, or "aot", an ATen graph
kiln's code generator was given) and what happened (`kind`): a crash (the compile or the run raised, or kiln
fell back to ATen where it meant to generate code) or an accuracy failure (the compiled graph ran, and an
output differs from eager beyond tolerance). A candidate keeps the failure when it fails the same way: the
same kind and, for a crash, the same exception type. A candidate eager cannot run is no repro at all.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kiln import fallbacks
from kiln.debug.accuracy import compare
from kiln.debug.minifier.graphs import Case

CRASH, ACCURACY, OK, EAGER_FAILS = "crash", "accuracy", "ok", "eager fails"


@dataclass(frozen=True)
class Outcome:
    kind: str  # CRASH, ACCURACY, OK or EAGER_FAILS
    detail: str = ""  # the exception (a crash), or the largest error (accuracy)
    error_type: str = ""  # a crash's exception type, which a candidate must keep

    def same_failure(self, other: Outcome) -> bool:
        return self.kind == other.kind and self.error_type == other.error_type


def tolerance(inputs: list) -> tuple[float, float]:
    """rtol, atol: looser where a graph reads half precision."""
    low = any(isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16) for t in inputs)
    return (1e-2, 1e-2) if low else (1e-3, 1e-3)


@dataclass
class Checker:
    """Compiles and runs a case the way the failing graph was: `compile(gm, inputs) -> callable`."""

    after: str
    compile: Callable[[torch.fx.GraphModule, list], Callable]
    check_accuracy: bool = True

    def outcome(self, case: Case) -> Outcome:
        try:
            expected = case.gm(*_clones(case.inputs))
        except Exception as e:  # noqa: BLE001  (any error: eager cannot run this candidate)
            return Outcome(EAGER_FAILS, _describe(e))
        with fallbacks.collected(count=False) as fell, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                actual = self.compile(case.gm, _clones(case.inputs))(*_clones(case.inputs))
            except Exception as e:  # noqa: BLE001  (a crash of any kind is what the minifier shrinks)
                return Outcome(CRASH, _describe(e), error_type(e))
        if fell:
            cause = fell[0].cause
            return Outcome(CRASH, f"kiln fell back to ATen: {fell[0].describe()}", cause.split(":", 1)[0])
        if not self.check_accuracy:
            return Outcome(OK)
        err = compare(_flat_detached(actual), _flat_detached(expected), *tolerance(case.inputs))
        return Outcome(ACCURACY, f"max abs error {err:.3g}") if err is not None else Outcome(OK)

    def fails_like(self, case: Case, failure: Outcome) -> bool:
        return self.outcome(case).same_failure(failure)


def error_type(e: BaseException) -> str:
    """A crash's type; a KilnStrictError stands for the fallback it reports, named by its cause's type."""
    if isinstance(e, fallbacks.KilnStrictError):
        return e.fallback.cause.split(":", 1)[0]
    return type(e).__name__


def _describe(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) < 300 else text[:297] + "..."


def _clones(values: list) -> list:
    """Fresh copies per run: a graph may write its inputs."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            copy = v.detach().clone()
            v = copy.requires_grad_(v.requires_grad) if copy.is_floating_point() or copy.is_complex() else copy
        out.append(v)
    return out


def _flat_detached(value: Any) -> list:
    return [v.detach() if isinstance(v, torch.Tensor) else v for v in torch.utils._pytree.tree_leaves(value)]
