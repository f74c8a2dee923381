"""Raising and handling exceptions: raise, the `except` clauses' opcodes, and unwinding to a handler.

See `values/exceptions.py` for which exceptions are traced; `Frame.unwind` jumps
to the handler these opcodes then run.
"""
from __future__ import annotations

from kiln.capture.breaks import GraphBreak
from kiln.capture.opcodes.registry import opcode
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.exceptions import (
    ExceptionValue,
    TracebackValue,
    TracedException,
    is_exception_class,
)
from kiln.capture.values.objects import ClassValue
from kiln.capture.values.torch_api import ExitValue


@opcode("RAISE_VARARGS")
def raise_varargs(frame, ins):
    if ins.arg == 0:  # bare `raise` inside an except block
        if not frame.handled:
            raise GraphBreak("exception", "RuntimeError: No active exception to reraise")
        raise TracedException(frame.handled[-1])
    if ins.arg == 2:
        frame.pop()  # the cause: `raise X from Y` raises X
    raise TracedException(as_exception(frame.pop()))


@opcode("RERAISE")
def reraise(frame, ins):
    exc = frame.pop()
    if not isinstance(exc, ExceptionValue):
        raise GraphBreak("exception", f"re-raising {exc}")
    raise TracedException(exc)


@opcode("PUSH_EXC_INFO")
def push_exc_info(frame, ins):
    exc = frame.pop()
    frame.push(frame.handled[-1] if frame.handled else ConstantValue(None))
    frame.push(exc)
    frame.handled.append(exc)


@opcode("POP_EXCEPT")
def pop_except(frame, ins):
    frame.pop()
    if frame.handled:
        frame.handled.pop()


@opcode("WITH_EXCEPT_START")
def with_except_start(frame, ins):
    """An exception leaves a `with` block: call its `__exit__` (fourth on the stack, in 3.11 and 3.12) with
    the exception; what it returns says whether the exception is suppressed (`contextlib.suppress`)."""
    exc = frame.peek()
    exit_fn = frame.stack[-4]
    entered_before = frame.state.opaque_inputs or (id(exit_fn) in frame.state.inherited_stack
                                                   and not isinstance(exit_fn.realize(), ExitValue))
    if isinstance(exc, ExceptionValue) and frame.is_root and entered_before and exc.raised_at is not None:
        # a block entered before this capture (natively, in a frame stepped through natively; or resumed in, by a
        # continuation): the manager is the user's, its `__exit__` runs natively and gets the traceback Python
        # gives, which only a raise run natively has: the break is at the raise
        frame.current = exc.raised_at
        raise GraphBreak("exception", f"{exc.message()} reaches a `with` block's `__exit__`, which reads its "
                                      "traceback")
    # a real exception (raised natively before this capture began) passes its own; a traced one the traceback
    # it will have, which exists only once its raise runs natively
    if not isinstance(exc, ExceptionValue):
        traceback = exc.getattr(frame.state, "__traceback__")
        frame.push(exit_fn.call(frame.state, [ClassValue(exc.python_type()), exc, traceback], {}))
        return
    try:
        frame.push(exit_fn.call(frame.state, [ClassValue(exc.python_type()), exc, TracebackValue(exc)], {}))
    except TracedException:
        raise
    except GraphBreak:
        # `__exit__` does what capture cannot (reads the traceback, calls what runs natively): the break is at
        # the raise, so that the exit runs natively with the traceback eager gives it; run here, it would get
        # the exception rebuilt, without one. (A `with` in a frame inlined into this one breaks at the call of
        # that frame, which then runs natively and raises for real.)
        if frame.is_root and exc.raised_at is not None:
            frame.current = exc.raised_at
        raise


@opcode("CHECK_EXC_MATCH")
def check_exc_match(frame, ins):
    match = frame.pop().as_constant()
    exc = frame.peek()
    frame.push(ConstantValue(issubclass(exc.python_type(), match)))


def as_exception(value: Value) -> ExceptionValue:
    """What `raise value` raises: a class is instantiated without arguments."""
    value = value.realize()
    if isinstance(value, ExceptionValue):
        return value
    if isinstance(value, ClassValue) and is_exception_class(value.cls):
        return ExceptionValue(value.cls, [])
    raise GraphBreak("exception", f"the traced code raises {value}")
