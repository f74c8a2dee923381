"""Calls whose only effect is outside the program: log records and warnings, replayed after the graph.

`logger.warning_once(...)` or `warnings.warn(...)` in model code compute
nothing the graph needs; tracing into `logging` (locks, frame inspection) would
only break the graph. They are recorded as side effects and made by the output
program after the graph runs, in program order, with the same arguments, so the
user sees the same messages as in eager. Arguments must be rebuildable Python
values; formatting a tensor's data into a message is a graph break.
"""
from __future__ import annotations

import logging
import warnings

from kiln.capture.breaks import GraphBreak
from kiln.capture.sources import AttrSource
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.objects import ObjectValue
from kiln.capture.values.tensor import TensorValue

# Logger methods that only emit records (transformers adds warning_once, info_once, warning_advice).
LOGGER_EMITTERS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "fatal", "exception", "log",
                             "warning_once", "info_once", "warning_advice"})


class DeferredCallValue(Value):
    """A callable, fetched by `source`, whose calls are recorded and made after the graph."""

    def __init__(self, fn: object, source):
        self.fn, self.source = fn, source

    def python_type(self) -> type:
        return type(self.fn)

    def call(self, state, args: list[Value], kwargs: dict[str, Value]) -> Value:
        for v in [*args, *kwargs.values()]:
            if isinstance(v.realize(), TensorValue):
                raise GraphBreak("tensor_to_python", "a tensor formatted into a log message or warning")
        state.side_effects.deferred_call(self, args, kwargs)
        return ConstantValue(None)

    def __repr__(self) -> str:
        return f"Deferred({getattr(self.fn, '__qualname__', self.fn)})"


class LoggerValue(ObjectValue):
    """A `logging.Logger`: its emitting methods are deferred calls; other attributes read as usual."""

    def getattr(self, state, name: str) -> Value:
        if name in LOGGER_EMITTERS and hasattr(self.obj, name):
            return DeferredCallValue(getattr(self.obj, name), AttrSource(self.source, name))
        return super().getattr(state, name)


def deferred_warn(state, *args: Value, **kwargs: Value) -> Value:
    """`warnings.warn(...)`: the warning is issued after the graph (its stack points at the output program)."""
    return DeferredCallValue(warnings.warn, state.constant_source(warnings.warn, "warnings_warn")).call(
        state, list(args), kwargs)


def is_logger(obj: object) -> bool:
    return isinstance(obj, logging.Logger)
