"""The frame loop: interpret one code object's bytecode over trackers.

A `Frame` holds a value stack, locals and cells, and steps through
instructions by looking each opname up in `OPCODES` (filled by the modules of
`opcodes/`, one per opcode family). Calls into Python functions inline a child
frame on the same `CaptureState`. The root frame additionally stops *before*
the instruction the capture chose as its graph break (`state.break_at`), with
its stack intact, so the output program can run that instruction natively.
"""
from __future__ import annotations

import builtins
import inspect
import types

from kiln.capture import bytecode
from kiln.capture.breaks import GraphBreak, UserLocation
from kiln.capture.builder import wrap
from kiln.capture.opcodes import OPCODES, Return
from kiln.capture.values.base import Value
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.containers import TupleValue
from kiln.capture.values.dicts import DictValue
from kiln.capture.values.exceptions import TracedException
from kiln.capture.values.functions import CellValue, FunctionValue
from kiln.capture.values.iterators import GeneratorValue
from kiln.capture.values.objects import object_value

MAX_INLINE_DEPTH = 64


class StopAtBreak(Exception):
    """The root frame reached the instruction chosen as this capture's graph break."""


class Frame:
    def __init__(self, state, code: types.CodeType, globals_: dict, locals_: dict[str, Value],
                 cells: dict[str, CellValue], *, is_root: bool, start: int = 0, stack: list[Value] | None = None,
                 self_value: Value | None = None):
        self.state, self.code, self.globals = state, code, globals_
        self.locals, self.cells = locals_, cells
        self.is_root = is_root
        self.instructions = bytecode.instructions(code)
        self.ip = start
        self.stack: list[Value] = list(stack or [])
        self.kw_names: tuple[str, ...] = ()
        self.self_value = self_value
        self.current: bytecode.Instruction | None = None
        self.handled: list[Value] = []  # exceptions being handled (`except` blocks entered), innermost last
        self.is_generator = False  # a generator's frame: `yield` suspends it (see values.iterators)
        self.suspended = False  # it stopped at a `yield` rather than returning

    # --- the stack ----------------------------------------------------------------------------
    def push(self, value: Value) -> None:
        self.stack.append(value)

    def pop(self) -> Value:
        return self.stack.pop()

    def popn(self, n: int) -> list[Value]:
        if n == 0:
            return []
        values = self.stack[-n:]
        del self.stack[-n:]
        return values

    def peek(self, depth: int = 1) -> Value:
        return self.stack[-depth]

    # --- running ------------------------------------------------------------------------------
    def run(self, throw: TracedException | None = None) -> Value:
        """Run to the return (or a generator's next `yield`); `throw`: resume a suspended generator by raising
        that exception at its `yield` (`gen.throw`), caught by a `try` around it or raised to the caller."""
        self.state.frames.append(self)
        try:
            if throw is not None and not self.unwind(throw):
                throw.add_frame(self.location())
                raise throw
            while True:
                ins = self.instructions[self.ip]
                if self.is_root and self.state.break_at == ins.index:
                    self.current = ins
                    raise StopAtBreak()
                self.current = ins
                self.ip += 1
                handler = OPCODES.get(ins.opname)
                if handler is None:
                    raise GraphBreak("unsupported_opcode", f"{ins.opname}")
                try:
                    handler(self, ins)
                except Return as r:
                    return r.value
                except TracedException as e:
                    if self.is_root and e.value.raised_at is None:
                        e.value.raised_at = ins
                    if not self.unwind(e):  # no `try` here catches it: on to the caller's frame
                        if self.is_root:
                            # it leaves the frame: the break is where it was raised, and the blocks it passed
                            # through (a `with`'s exit, re-raising) run natively in the output program
                            self.current = e.value.raised_at
                        e.add_frame(self.location())
                        raise
                except GraphBreak as e:
                    e.add_frame(self.location())
                    raise
        finally:
            self.state.frames.pop()

    def jump(self, target: int) -> None:
        self.ip = target

    def unwind(self, exc: TracedException) -> bool:
        """Jump to the handler of the innermost `try` around the current instruction, as CPython does:
        the exception-table entry covering it gives the stack depth and the target. False when none does."""
        entry = bytecode.handler_around(self.code, self.current.index)
        if entry is None:
            return False
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(ConstantValue(self.current.offset))
        self.push(exc.value)
        self.jump(entry.target)
        return True

    def location(self) -> UserLocation:
        lineno = self.current.lineno if self.current is not None else self.code.co_firstlineno
        return UserLocation(self.code.co_filename, lineno or self.code.co_firstlineno, self.code.co_name)

    def zero_arg_super(self) -> tuple[type, Value]:
        """`super()` with no arguments: the class from the `__class__` cell, self from the first argument."""
        if "__class__" not in self.cells or not self.code.co_varnames:
            raise GraphBreak("unsupported_call", "super() outside a method")
        cls = self.cells["__class__"].load(self.state).as_constant()
        return cls, self.locals[self.code.co_varnames[0]]

    def global_value(self, name: str) -> Value:
        pending = self.state.pending_globals.get((id(self.globals), name))
        if pending is not None:
            return pending
        if name in self.globals and _is_torch_internal(self.globals):
            return object_value(self.globals[name], self.state)  # torch's own module globals are not guarded
        if name in self.globals:
            return wrap(self.state, self.globals[name], self.state.global_source(self.globals, name))
        if hasattr(builtins, name):
            return object_value(getattr(builtins, name), self.state)
        raise GraphBreak("exception", f"NameError: name {name!r} is not defined")


def _is_torch_internal(globals_: dict) -> bool:
    name = globals_.get("__name__", "") or ""
    return name == "torch" or name.startswith("torch.")


# ------------------------------------------------------------------------------------------
# Inlining a call
# ------------------------------------------------------------------------------------------

def inline_call(state, fn: FunctionValue, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if len(state.frames) > MAX_INLINE_DEPTH:
        raise GraphBreak("recursion", f"inlining {fn.name}")
    code = fn.code
    if code.co_flags & (inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | inspect.CO_ASYNC_GENERATOR):
        raise GraphBreak("unsupported_call", f"{fn.name} is a coroutine")
    locals_ = bind_arguments(fn, args, kwargs)
    cells = {name: cell for name, cell in zip(code.co_freevars, fn.closure)}
    frame = Frame(state, code, fn.globals, locals_, cells, is_root=False)
    if code.co_flags & inspect.CO_GENERATOR:  # a generator (a genexpr too): its frame runs on each next()
        return GeneratorValue(state, frame, fn, args, kwargs)
    return frame.run()


def bind_arguments(fn: FunctionValue, args: list[Value], kwargs: dict[str, Value]) -> dict[str, Value]:
    """Python's argument binding, over trackers."""
    code = fn.code
    npos, nkwonly = code.co_argcount, code.co_kwonlyargcount
    names = code.co_varnames
    positional = names[:npos]
    kwonly = names[npos:npos + nkwonly]
    has_varargs = bool(code.co_flags & inspect.CO_VARARGS)
    has_varkw = bool(code.co_flags & inspect.CO_VARKEYWORDS)
    bound: dict[str, Value] = {}
    for name, value in zip(positional, args):
        bound[name] = value
    extra = args[npos:]
    if extra and not has_varargs:
        raise GraphBreak("exception",
                         f"TypeError: {fn.name}() takes {npos} positional arguments but {len(args)} were given")
    varkw: dict[str, Value] = {}
    posonly = set(names[:code.co_posonlyargcount])
    for name, value in kwargs.items():
        if name in bound and name not in posonly:
            raise GraphBreak("exception", f"TypeError: {fn.name}() got multiple values for argument {name!r}")
        if (name in positional and name not in posonly) or name in kwonly:
            bound[name] = value
        elif has_varkw:
            varkw[name] = value
        else:
            raise GraphBreak("exception", f"TypeError: {fn.name}() got an unexpected keyword argument {name!r}")
    defaults = fn.defaults
    for i, name in enumerate(positional):
        if name not in bound:
            d = i - (npos - len(defaults))
            if d < 0:
                raise GraphBreak("exception", f"TypeError: {fn.name}() missing argument {name!r}")
            bound[name] = defaults[d]
    for name in kwonly:
        if name not in bound:
            if name not in fn.kwdefaults:
                raise GraphBreak("exception", f"TypeError: {fn.name}() missing keyword argument {name!r}")
            bound[name] = fn.kwdefaults[name]
    index = npos + nkwonly
    if has_varargs:
        bound[names[index]] = TupleValue(list(extra))
        index += 1
    if has_varkw:
        bound[names[index]] = DictValue(varkw)
    return bound
