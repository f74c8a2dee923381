"""Calls, function creation and `with` blocks."""
from __future__ import annotations

import types

from kiln.capture.breaks import GraphBreak
from kiln.capture.opcodes.operators import unary
from kiln.capture.opcodes.registry import opcode
from kiln.capture.values.base import NULL
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.containers import TupleValue
from kiln.capture.values.exceptions import ExceptionValue
from kiln.capture.values.functions import FunctionValue
from kiln.capture.values.torch_api import AutocastContext, ExitValue, GradModeContext


@opcode("KW_NAMES")
def kw_names(frame, ins):
    frame.kw_names = frame.code.co_consts[ins.arg]


def split_call(frame, argc: int):
    """Pop a CALL's operands: (callable, positional args, keyword args). Same layout on 3.11 and 3.12."""
    items = frame.popn(argc + 2)
    fn, args = (items[1], items[2:]) if items[0] is NULL else (items[0], items[1:])
    names, frame.kw_names = frame.kw_names, ()
    if names:
        kwargs = dict(zip(names, args[len(args) - len(names):]))
        args = args[:len(args) - len(names)]
    else:
        kwargs = {}
    return fn, list(args), kwargs


@opcode("CALL")
def call(frame, ins):
    fn, args, kwargs = split_call(frame, ins.arg)
    frame.push(fn.realize().call(frame.state, args, kwargs))


@opcode("CALL_FUNCTION_EX")
def call_function_ex(frame, ins):
    kwargs_value = frame.pop().realize() if ins.arg & 1 else None
    args_value = frame.pop()
    fn = frame.pop()
    if frame.stack and frame.peek() is NULL:
        frame.pop()
    args = args_value.unpack(frame.state)
    kwargs = {}
    if kwargs_value is not None:
        kwargs = {k: v for k, v in getattr(kwargs_value, "items", {}).items()}
        if not hasattr(kwargs_value, "items"):
            raise GraphBreak("unsupported_object", f"**{kwargs_value}")
    frame.push(fn.realize().call(frame.state, args, kwargs))


@opcode("MAKE_FUNCTION")
def make_function(frame, ins):
    code = frame.pop().as_constant()
    flags = ins.arg
    closure = tuple(frame.pop().unpack(frame.state)) if flags & 0x08 else ()
    annotations = tuple(frame.pop().unpack(frame.state)) if flags & 0x04 else None  # (name, value, ...)
    kwdefaults = dict(frame.pop().realize().items) if flags & 0x02 else {}
    defaults = tuple(frame.pop().unpack(frame.state)) if flags & 0x01 else ()
    fn = FunctionValue(code, frame.globals, code.co_name, defaults, kwdefaults, closure)
    fn.annotations = annotations
    frame.push(fn)


@opcode("CALL_INTRINSIC_1", since=(3, 12))
def call_intrinsic_1(frame, ins):
    value = frame.pop()
    if ins.argrepr == "INTRINSIC_LIST_TO_TUPLE":
        frame.push(TupleValue(value.unpack(frame.state)))
    elif ins.argrepr == "INTRINSIC_UNARY_POSITIVE":
        frame.push(unary(frame, "pos", value))
    elif ins.argrepr == "INTRINSIC_STOPITERATION_ERROR":  # 3.12's generators: StopIteration escaping the body
        stops = issubclass(value.python_type(), StopIteration)
        frame.push(ExceptionValue(RuntimeError, [ConstantValue("generator raised StopIteration")]) if stops else value)
    else:
        raise GraphBreak("unsupported_opcode", f"CALL_INTRINSIC_1 {ins.argrepr}")


@opcode("BEFORE_WITH")
def before_with(frame, ins):
    ctx = frame.pop().realize()
    if isinstance(ctx, (GradModeContext, AutocastContext)):
        frame.push(ExitValue(ctx))
        frame.push(ctx.enter(frame.state))
        return
    if _has_python_protocol(ctx):  # a context manager written in Python (nullcontext, a user's class): inline it
        frame.state.in_python_block = True
        exit_method = ctx.getattr(frame.state, "__exit__")
        entered = ctx.getattr(frame.state, "__enter__").call(frame.state, [], {})
        frame.push(exit_method)
        frame.push(entered)
        return
    raise GraphBreak("unknown_context", f"with {ctx}")


def _has_python_protocol(ctx) -> bool:
    """True when both __enter__ and __exit__ are Python functions on the object's class."""
    try:
        cls = ctx.python_type()
    except GraphBreak:
        return False
    return all(isinstance(getattr(cls, name, None), types.FunctionType) for name in ("__enter__", "__exit__"))


@opcode("LOAD_BUILD_CLASS")
def load_build_class(frame, ins):
    raise GraphBreak("unsupported_opcode", "a class statement inside the compiled region")


