"""Running the breaking instruction natively, as Python source in the output program.

When capture stops before an instruction it cannot trace, the output program
performs that one instruction with real objects (a call, a branch on a
tensor's value, a step of an unknown iterator, ...) and then calls the
continuation with the resulting stack. Each renderer gets the stack as
expressions (`None` for CPython's NULL) and a `resume(index, stack)` callback
that writes the call of the continuation starting at instruction `index`.
"""
from __future__ import annotations

import builtins
import os
import sys
import types
from collections.abc import Callable

from kiln.capture.breaks import Unresumable
from kiln.capture.bytecode import Instruction, handler_around, instructions
from kiln.capture.values.base import NULL, LazyValue
from kiln.capture.values.functions import BuiltinValue
from kiln.capture.values.operators import BINARY_OPS, COMPARE_OPS

Stack = list  # list[str | None]
Resume = Callable[[int, Stack], str]

RENDERERS: dict[str, Callable] = {}


def renders(*names):
    def register(fn):
        for n in names:
            RENDERERS[n] = fn
        return fn

    return register


def render_instruction(ins: Instruction, stack: Stack, kw_names: tuple, resume: Resume,
                       temp: Callable[[], str]) -> list[str]:
    renderer = RENDERERS.get(ins.opname)
    if renderer is None:
        raise Unresumable("unsupported_opcode", f"cannot resume after {ins.opname}")
    return renderer(ins, stack, kw_names, resume, temp)


def _args(args: list[str], kw_names: tuple) -> str:
    positional = args[:len(args) - len(kw_names)] if kw_names else args
    keywords = [f"{k}={v}" for k, v in zip(kw_names, args[len(args) - len(kw_names):])] if kw_names else []
    return ", ".join(positional + keywords)


@renders("CALL")
def _call(ins, stack, kw_names, resume, temp):
    n = ins.arg + 2
    items, rest = stack[-n:], stack[:-n]
    fn, args = (items[1], items[2:]) if items[0] is None else (items[0], items[1:])
    r = temp()
    call = f"{r} = ___call_nested({fn}{', ' if args else ''}{_args(args, kw_names)})"
    return [call, resume(ins.index + 1, rest + [r])]


@renders("CALL_FUNCTION_EX")
def _call_ex(ins, stack, kw_names, resume, temp):
    has_kwargs = ins.arg & 1
    kwargs = stack[-1] if has_kwargs else None
    args = stack[-1 - has_kwargs]
    fn = stack[-2 - has_kwargs]
    rest = stack[:-2 - has_kwargs]
    if rest and rest[-1] is None:
        rest = rest[:-1]
    r = temp()
    star_kwargs = f", **{kwargs}" if kwargs else ""
    return [f"{r} = ___call_nested({fn}, *{args}{star_kwargs})", resume(ins.index + 1, rest + [r])]


def _branch(condition: str, taken: str, not_taken: str) -> list[str]:
    # `else`, not a fall-through: inside a block, `resume` assigns the continuation instead of returning it
    return [f"if {condition}:", f"    {taken}", "else:", f"    {not_taken}"]


@renders("POP_JUMP_IF_TRUE")
def _jump_true(ins, stack, kw, resume, temp):
    return _branch(stack[-1], resume(ins.target, stack[:-1]), resume(ins.index + 1, stack[:-1]))


@renders("POP_JUMP_IF_FALSE")
def _jump_false(ins, stack, kw, resume, temp):
    return _branch(f"not {stack[-1]}", resume(ins.target, stack[:-1]), resume(ins.index + 1, stack[:-1]))


@renders("POP_JUMP_IF_NONE")
def _jump_none(ins, stack, kw, resume, temp):
    return _branch(f"{stack[-1]} is None", resume(ins.target, stack[:-1]), resume(ins.index + 1, stack[:-1]))


@renders("POP_JUMP_IF_NOT_NONE")
def _jump_not_none(ins, stack, kw, resume, temp):
    return _branch(f"{stack[-1]} is not None", resume(ins.target, stack[:-1]), resume(ins.index + 1, stack[:-1]))


@renders("JUMP_IF_FALSE_OR_POP")
def _jump_false_or_pop(ins, stack, kw, resume, temp):
    return _branch(f"not {stack[-1]}", resume(ins.target, stack), resume(ins.index + 1, stack[:-1]))


@renders("JUMP_IF_TRUE_OR_POP")
def _jump_true_or_pop(ins, stack, kw, resume, temp):
    return _branch(stack[-1], resume(ins.target, stack), resume(ins.index + 1, stack[:-1]))


@renders("GET_ITER")
def _get_iter(ins, stack, kw, resume, temp):
    r = temp()
    return [f"{r} = iter({stack[-1]})", resume(ins.index + 1, stack[:-1] + [r])]


@renders("FOR_ITER")
def _for_iter(ins, stack, kw, resume, temp):
    r = temp()
    return [
        "try:",
        f"    {r} = next({stack[-1]})",
        "except StopIteration:",
        f"    {resume(ins.target, stack[:-1])}",
        "else:",
        f"    {resume(ins.index + 1, stack + [r])}",
    ]


@renders("BINARY_OP")
def _binary_op(ins, stack, kw, resume, temp):
    r = temp()
    op = ins.argrepr
    if op.endswith("=") and op not in ("==", "!=", "<=", ">="):
        line = f"{r} = {stack[-2]}; {r} {op} {stack[-1]}"
    else:
        line = f"{r} = {stack[-2]} {op} {stack[-1]}"
    assert op in BINARY_OPS
    return [line, resume(ins.index + 1, stack[:-2] + [r])]


@renders("COMPARE_OP")
def _compare_op(ins, stack, kw, resume, temp):
    r = temp()
    assert ins.argval in COMPARE_OPS
    return [f"{r} = {stack[-2]} {ins.argval} {stack[-1]}", resume(ins.index + 1, stack[:-2] + [r])]


@renders("CONTAINS_OP", "IS_OP")
def _membership_or_identity(ins, stack, kw, resume, temp):
    r = temp()
    op = {"CONTAINS_OP": ("in", "not in"), "IS_OP": ("is", "is not")}[ins.opname][bool(ins.arg)]
    return [f"{r} = {stack[-2]} {op} {stack[-1]}", resume(ins.index + 1, stack[:-2] + [r])]


@renders("UNARY_NOT")
def _not(ins, stack, kw, resume, temp):
    r = temp()
    return [f"{r} = not {stack[-1]}", resume(ins.index + 1, stack[:-1] + [r])]


@renders("UNARY_NEGATIVE", "UNARY_INVERT", "UNARY_POSITIVE")
def _unary(ins, stack, kw, resume, temp):
    r = temp()
    sign = {"UNARY_NEGATIVE": "-", "UNARY_INVERT": "~", "UNARY_POSITIVE": "+"}[ins.opname]
    return [f"{r} = {sign}{stack[-1]}", resume(ins.index + 1, stack[:-1] + [r])]


@renders("BINARY_SUBSCR")
def _subscr(ins, stack, kw, resume, temp):
    r = temp()
    return [f"{r} = {stack[-2]}[{stack[-1]}]", resume(ins.index + 1, stack[:-2] + [r])]


@renders("STORE_SUBSCR")
def _store_subscr(ins, stack, kw, resume, temp):
    return [f"{stack[-2]}[{stack[-1]}] = {stack[-3]}", resume(ins.index + 1, stack[:-3])]


@renders("LOAD_ATTR")
def _load_attr(ins, stack, kw, resume, temp):
    r = temp()
    pushed = [None, r] if ins.method_load else [r]
    return [f"{r} = getattr({stack[-1]}, {ins.argval!r})", resume(ins.index + 1, stack[:-1] + pushed)]


@renders("LOAD_GLOBAL")
def _load_global(ins, stack, kw, resume, temp):
    """A global capture could not read (a name the module does not define): Python's own lookup,
    through the module's globals then its builtins, raises the NameError eager raises."""
    r = temp()
    pushed = [None, r] if ins.method_load else [r]
    return [f"{r} = eval({ins.argval!r}, G)", resume(ins.index + 1, stack + pushed)]


@renders("LOAD_FAST")
def _load_fast(ins, stack, kw, resume, temp):
    """A local read before it is bound (the only way LOAD_FAST breaks: a `with` block whose `__exit__` suppressed
    the exception that skipped its assignment): the UnboundLocalError eager raises, at its line."""
    message = f"cannot access local variable {ins.argval!r} where it is not associated with a value"
    return [f"___raise_at({ins.lineno}, UnboundLocalError({message!r}))"]


@renders("STORE_ATTR")
def _store_attr(ins, stack, kw, resume, temp):
    return [f"setattr({stack[-1]}, {ins.argval!r}, {stack[-2]})", resume(ins.index + 1, stack[:-2])]


@renders("UNPACK_SEQUENCE")
def _unpack(ins, stack, kw, resume, temp):
    r = temp()
    items = [f"{r}[{i}]" for i in reversed(range(ins.arg))]
    return [f"{r} = tuple({stack[-1]})",
            f"if len({r}) != {ins.arg}: raise ValueError(f'expected {ins.arg} values to unpack, got {{len({r})}}')",
            resume(ins.index + 1, stack[:-1] + items)]


@renders("RAISE_VARARGS")
def _raise(ins, stack, kw, resume, temp):
    if ins.arg == 1:
        return [f"___raise_at({ins.lineno}, {stack[-1]})"]
    if ins.arg == 2:
        return [f"___raise_at({ins.lineno}, {stack[-2]}, {stack[-1]})"]
    raise Unresumable("unsupported_opcode", "a bare `raise`")


_NO_CAUSE = object()
_AT_LINE: dict[tuple, object] = {}  # (file, function, line, statement) -> the statement's code, at that line


def _run_at(code, lineno: int | None, statement: str, namespace: dict) -> None:
    """Run `statement` in a frame of the user's function (`code`'s file and name) at line `lineno`, as traceback
    printing and `traceback.extract_tb` read a frame (the line's text comes from the file)."""
    key = (code.co_filename, code.co_name, lineno, statement)
    at_line = _AT_LINE.get(key)
    if at_line is None:  # a module's code at the line (blank lines before it), named as the function
        module = compile("\n" * ((lineno or code.co_firstlineno) - 1) + statement, code.co_filename, "exec")
        at_line = _AT_LINE[key] = module.replace(co_name=code.co_name)
    exec(at_line, namespace)


def raise_at(code, lineno: int | None, exc, cause=_NO_CAUSE):
    """RAISE_VARARGS run natively: `raise exc` (`from cause`), from a frame of the user's function at the
    statement's line, so that the traceback a `with` block's `__exit__` gets (and the user sees) ends where
    eager's does: in that function, at that line (Python's `raise` puts the raising frame last)."""
    if cause is _NO_CAUSE:
        _run_at(code, lineno, "raise ___exc", {"___exc": exc})
    else:
        _run_at(code, lineno, "raise ___exc from ___cause", {"___exc": exc, "___cause": cause})


def raised_at(code, lineno: int | None, exc: BaseException) -> BaseException:
    """`exc`, raised by an instruction the output program ran natively, with a frame of the user's function at
    the instruction's line in its traceback, after the program's own frame (the caller): where eager's traceback
    has the function's frame, so what a `with` block's `__exit__` reads of it is what eager's reads (the
    frames the error came from, below it, are the same)."""
    program = sys._getframe(1)
    frames: list = []
    _run_at(code, lineno, "___frames.append(___current_frame())", {"___frames": frames,
                                                                   "___current_frame": sys._getframe})
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame is not program:
        tb = tb.tb_next
    if tb is None:
        return exc
    below = tb.tb_next
    if _all_kiln(below):  # kiln's own code of the instruction (`enter_with`): eager has no frame there
        below = None
    tb.tb_next = types.TracebackType(below, frames[0], frames[0].f_lasti, lineno or frames[0].f_lineno)
    return exc


PROGRAM_FILE_PREFIX = "<kiln program "  # the file name of each output program's code: "<kiln program NAME>"
_KILN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _all_kiln(tb) -> bool:
    """Whether the traceback entries from `tb` on (at least one) are all frames of kiln's own modules."""
    if tb is None:
        return False
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_KILN):
            return False
        tb = tb.tb_next
    return True


@renders("FORMAT_VALUE")
def _format_value(ins, stack, kw, resume, temp):
    r = temp()
    convert = {0: "", 1: "str", 2: "repr", 3: "ascii"}[ins.arg & 0x03]
    has_spec = bool(ins.arg & 0x04)
    value, spec = (stack[-2], stack[-1]) if has_spec else (stack[-1], "''")
    rest = stack[:-2] if has_spec else stack[:-1]
    return [f"{r} = format({convert}({value}), {spec})", resume(ins.index + 1, rest + [r])]


# --- `with` blocks entered natively: a frame stepped through natively meets managers it got natively (every
# input of such a frame is opaque), so it enters them itself and leaves them through its exception table
# (`within_handler`): the exit on a normal path, a `return`, `break` or `continue` is the block's own call of
# `__exit__(None, None, None)`, a native call like any other.

@renders("BEFORE_WITH")
def _before_with(ins, stack, kw, resume, temp):
    exit_, entered = temp(), temp()
    return [f"{exit_}, {entered} = ___enter_with({stack[-1]}, ___call_nested)",
            resume(ins.index + 1, stack[:-1] + [exit_, entered])]


def _special_method(manager, name: str):
    """`manager.name` as the interpreter looks a special method up: on the type (its MRO), bound by its descriptor
    protocol; None when the type has none."""
    cls = type(manager)
    for klass in cls.__mro__:
        if name in vars(klass):
            found = vars(klass)[name]
            get = getattr(type(found), "__get__", None)
            return get(found, manager, cls) if get is not None else found
    return None


def enter_with(manager, call: Callable) -> tuple:
    """BEFORE_WITH: the manager's bound `__exit__` and what its `__enter__` returned (called through `call`, which
    compiles a Python `__enter__`), with the TypeError CPython raises for an object that is not a manager."""
    enter = _special_method(manager, "__enter__")
    if enter is None:
        raise TypeError(f"'{type(manager).__name__}' object does not support the context manager protocol")
    exit_ = _special_method(manager, "__exit__")
    if exit_ is None:
        raise TypeError(f"'{type(manager).__name__}' object does not support the context manager protocol "
                        "(missed __exit__ method)")
    return exit_, call(enter)


@renders("WITH_EXCEPT_START")
def _with_except_start(ins, stack, kw, resume, temp):
    """An exception leaves a block whose `__exit__` (fourth on the stack) is a native value: call it with the
    exception; what it returns says whether the exception is suppressed."""
    r = temp()
    return [f"{r} = ___exit_with({stack[-4]}, {stack[-1]})", resume(ins.index + 1, stack + [r])]


def exit_with(call: Callable, exit_, exc: BaseException):
    """WITH_EXCEPT_START run natively: `exit_(type, exc, traceback)` through `call`. CPython calls it while it
    handles `exc`, so an exception `__exit__` raises has `exc` as its context (`__context__`, "During handling
    of the above exception, another exception occurred"); here nothing is being handled, so the chain is made
    as CPython makes it: `exc` becomes the context at its end."""
    try:
        return call(exit_, type(exc), exc, exc.__traceback__)
    except BaseException as error:
        seen, last = {id(exc)}, error
        while id(last) not in seen and last.__context__ is not None:
            seen.add(id(last))
            last = last.__context__
        if id(last) not in seen:
            last.__context__ = exc
        raise


def from_users_frame(exc: BaseException) -> BaseException:
    """`exc`, caught by the output program for a `with` block's handler, with its traceback from the first frame
    that is the user's (`raise_at` and `raised_at` put one of the user's function at the line), as eager's starts
    at the frame of the `with` block when its `__exit__` reads it: the program's own frame and kiln's before it
    are not frames of the user's program. Unchanged where none is the user's."""
    first = exc.__traceback__
    while first is not None and (first.tb_frame.f_code.co_filename.startswith(_KILN)
                                 or first.tb_frame.f_code.co_filename.startswith(PROGRAM_FILE_PREFIX)):
        first = first.tb_next
    if first is not None:
        exc.__traceback__ = first
    return exc


@renders("RERAISE")
def _reraise(ins, stack, kw, resume, temp):
    return [f"raise {stack[-1]}"]


def within_handler(code, ins: Instruction, stack: Stack, lines: list[str], resume: Resume) -> list[str]:
    """`lines` (the breaking instruction run natively, then the call of the continuation) of a frame stepped
    through natively, inside the handler of the exception-table entry around the instruction, as the frame's
    own table would send an exception raised there: to the cleanup of a `with` block, whose `__exit__` sees it
    and may suppress it. A continuation has no handlers of its own; the handler runs as one, from the entry's
    target with the stack it expects (kept to the entry's depth, the raising offset, the exception)."""
    entry = handler_around(code, ins.index)
    if entry is None:
        return lines
    kept = stack[:entry.depth] + ([repr(ins.offset)] if entry.lasti else [])
    # see raised_at; a raise has its frame already (`raise_at`), a re-raise the frames it was first raised from
    exc = "___exc" if ins.opname in ("RAISE_VARARGS", "RERAISE") else f"___raised_at({ins.lineno}, ___exc)"
    exc = f"___from_users_frame({exc})"
    return (["try:", *("    " + line for line in lines), "except BaseException as ___exc:",
             "    " + resume(entry.target, kept + [exc])])


# --- slices, container building, imports, deletions: their handlers break on values kiln does
# not model (an opaque object, a tensor used as a key), so a continuation may stop at them too.

@renders("BINARY_SLICE")
def _binary_slice(ins, stack, kw, resume, temp):
    r = temp()
    return [f"{r} = {stack[-3]}[{stack[-2]}:{stack[-1]}]", resume(ins.index + 1, stack[:-3] + [r])]


@renders("STORE_SLICE")
def _store_slice(ins, stack, kw, resume, temp):
    return [f"{stack[-3]}[{stack[-2]}:{stack[-1]}] = {stack[-4]}", resume(ins.index + 1, stack[:-4])]


@renders("UNPACK_EX")
def _unpack_ex(ins, stack, kw, resume, temp):
    before, after = ins.arg & 0xFF, ins.arg >> 8
    r, m = temp(), temp()
    items = [f"{r}[{i}]" for i in range(before)] + [m] + [f"{r}[len({r}) - {after - i}]" for i in range(after)]
    return [f"{r} = list({stack[-1]})",
            f"if len({r}) < {before + after}: raise ValueError('not enough values to unpack')",
            f"{m} = {r}[{before}:len({r}) - {after}]",
            resume(ins.index + 1, stack[:-1] + list(reversed(items)))]


def _container_method(method: str):
    """LIST_APPEND(i), SET_ADD(i), LIST_EXTEND(i), SET_UPDATE(i), DICT_UPDATE(i), DICT_MERGE(i): the
    container sits i below the popped value."""
    def render(ins, stack, kw, resume, temp):
        target = stack[-1 - ins.arg]
        return [f"{target}.{method}({stack[-1]})", resume(ins.index + 1, stack[:-1])]

    return render


for _name, _method in (("LIST_APPEND", "append"), ("SET_ADD", "add"), ("LIST_EXTEND", "extend"),
                       ("SET_UPDATE", "update"), ("DICT_UPDATE", "update"), ("DICT_MERGE", "update")):
    RENDERERS[_name] = _container_method(_method)


@renders("MAP_ADD")
def _map_add(ins, stack, kw, resume, temp):
    return [f"{stack[-3 - ins.arg + 1]}[{stack[-2]}] = {stack[-1]}", resume(ins.index + 1, stack[:-2])]


@renders("LIST_TO_TUPLE")
def _list_to_tuple(ins, stack, kw, resume, temp):
    """`f(a, *args)` on 3.11 builds a list, extends it with `args` and makes it a tuple: where `args` was
    unknown, the list is one of the output program's values and its tuple is made there too."""
    r = temp()
    return [f"{r} = tuple({stack[-1]})", resume(ins.index + 1, stack[:-1] + [r])]


@renders("BUILD_STRING")
def _build_string(ins, stack, kw, resume, temp):
    r = temp()
    parts = stack[len(stack) - ins.arg:]
    return [f"{r} = ''.join([{', '.join(parts)}])", resume(ins.index + 1, stack[:len(stack) - ins.arg] + [r])]


@renders("BUILD_MAP")
def _build_map(ins, stack, kw, resume, temp):
    r = temp()
    items = stack[len(stack) - 2 * ins.arg:]
    pairs = ", ".join(f"{items[i]}: {items[i + 1]}" for i in range(0, len(items), 2))
    return [f"{r} = {{{pairs}}}", resume(ins.index + 1, stack[:len(stack) - 2 * ins.arg] + [r])]


@renders("BUILD_SET")
def _build_set(ins, stack, kw, resume, temp):
    r = temp()
    items = stack[len(stack) - ins.arg:]
    return [f"{r} = {{{', '.join(items)}}}" if items else f"{r} = set()",
            resume(ins.index + 1, stack[:len(stack) - ins.arg] + [r])]


@renders("CALL_INTRINSIC_1")
def _call_intrinsic_1(ins, stack, kw, resume, temp):
    r = temp()
    expr = {"INTRINSIC_UNARY_POSITIVE": f"+{stack[-1]}",
            "INTRINSIC_LIST_TO_TUPLE": f"tuple({stack[-1]})"}.get(ins.argrepr)
    if expr is None:
        raise Unresumable("unsupported_opcode", f"cannot resume after CALL_INTRINSIC_1 {ins.argrepr}")
    return [f"{r} = {expr}", resume(ins.index + 1, stack[:-1] + [r])]


@renders("LOAD_SUPER_ATTR")
def _load_super_attr(ins, stack, kw, resume, temp):
    r = temp()
    pushed = [None, r] if ins.method_load else [r]
    load = f"{r} = getattr({stack[-3]}({stack[-2]}, {stack[-1]}), {ins.argval!r})"
    return [load, resume(ins.index + 1, stack[:-3] + pushed)]


@renders("IMPORT_NAME")
def _import_name(ins, stack, kw, resume, temp):
    r = temp()
    return [f"{r} = __import__({ins.argval!r}, G, None, {stack[-1]}, {stack[-2]})",
            resume(ins.index + 1, stack[:-2] + [r])]


@renders("IMPORT_FROM")
def _import_from(ins, stack, kw, resume, temp):
    r = temp()
    return [f"{r} = getattr({stack[-1]}, {ins.argval!r})", resume(ins.index + 1, stack + [r])]


@renders("DELETE_ATTR")
def _delete_attr(ins, stack, kw, resume, temp):
    return [f"delattr({stack[-1]}, {ins.argval!r})", resume(ins.index + 1, stack[:-1])]


@renders("DELETE_SUBSCR")
def _delete_subscr(ins, stack, kw, resume, temp):
    return [f"del {stack[-2]}[{stack[-1]}]", resume(ins.index + 1, stack[:-2])]


# Instructions whose handlers never raise a graph break (or only for a Python error the frame
# would raise anyway): a continuation never has to run one natively. (LOAD_GLOBAL breaks on a name
# the module lacks, and is rendered: a continuation has no frame to raise that NameError otherwise.)
NEVER_BREAKS = frozenset({
    "NOP", "RESUME", "PRECALL", "COPY_FREE_VARS", "CACHE", "EXTENDED_ARG", "POP_TOP", "PUSH_NULL", "COPY", "SWAP",
    "END_FOR", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST", "MAKE_CELL", "LOAD_FAST_AND_CLEAR",
    "STORE_FAST", "DELETE_FAST", "LOAD_CLOSURE", "LOAD_DEREF", "STORE_DEREF", "JUMP_FORWARD", "JUMP_BACKWARD",
    "JUMP_ABSOLUTE", "JUMP", "KW_NAMES", "BUILD_TUPLE", "BUILD_LIST", "BUILD_SLICE",
    "BUILD_CONST_KEY_MAP", "STORE_GLOBAL", "MAKE_FUNCTION", "LOAD_ASSERTION_ERROR",
    "PUSH_EXC_INFO", "POP_EXCEPT", "CHECK_EXC_MATCH",
})


def resumable_anywhere(code) -> bool:
    """True when every instruction of `code` either never breaks or can run natively in a
    continuation; otherwise a break in this function runs the whole frame natively, since a
    continuation stopping at such an instruction could not go on (and has no frame to fall back to)."""
    return all(ins.opname in RENDERERS or ins.opname in NEVER_BREAKS for ins in instructions(code))


# Builtins that read the calling frame's namespaces when given none: run natively after a break, the frame
# they would read is the output program's.
FRAME_READERS = (builtins.eval, builtins.exec)


def calls_frame_reader(ins: Instruction, stack: list, kw_names: tuple) -> bool:
    """Whether the breaking instruction is a call `eval(s)` or `exec(s)` (one argument: the frame's namespaces)."""
    if ins.opname != "CALL" or ins.arg != 1 or kw_names or len(stack) < 3 or stack[-3] is not NULL:
        return False
    callee = stack[-2]
    if isinstance(callee, LazyValue):  # not looked at before the break: asked without wrapping it
        return callee.is_one_of(FRAME_READERS)
    callee = callee.realize()
    return isinstance(callee, BuiltinValue) and any(callee.fn is reader for reader in FRAME_READERS)


def read_in_frame(reader: Callable, frame_locals: dict, cells: dict, *, frame_globals: dict) -> Callable:
    """`eval`/`exec` of one argument as run in the user's frame: its globals, and its locals at the break (the
    variables, and the contents of its cells that are assigned)."""
    namespace = dict(frame_locals)
    for name, cell in cells.items():
        try:
            namespace[name] = cell.cell_contents
        except ValueError:  # not assigned yet: not a local of the frame's either
            pass
    return lambda source: reader(source, frame_globals, namespace)
