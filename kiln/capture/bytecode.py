"""Reading CPython bytecode: the one place that knows how 3.11 and 3.12 differ.

The interpreter sees `Instruction`s whose `opname` is normalized (3.11's
`POP_JUMP_FORWARD_IF_FALSE` and `POP_JUMP_BACKWARD_IF_FALSE` are both
`POP_JUMP_IF_FALSE`), whose jump targets are instruction indices, and whose
`method_load` says whether a LOAD_ATTR/LOAD_METHOD/LOAD_GLOBAL pushes the NULL
that CALL expects. Handlers never look at `sys.version_info`.
"""
from __future__ import annotations

import dis
import sys
import types
from dataclasses import dataclass
from functools import cache

PY312 = sys.version_info >= (3, 12)

SUPPORTED_VERSIONS = ((3, 11), (3, 12))

_RENAMES = {
    "POP_JUMP_FORWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_BACKWARD_IF_FALSE": "POP_JUMP_IF_FALSE",
    "POP_JUMP_FORWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_BACKWARD_IF_TRUE": "POP_JUMP_IF_TRUE",
    "POP_JUMP_FORWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_BACKWARD_IF_NONE": "POP_JUMP_IF_NONE",
    "POP_JUMP_FORWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "POP_JUMP_BACKWARD_IF_NOT_NONE": "POP_JUMP_IF_NOT_NONE",
    "JUMP_BACKWARD_NO_INTERRUPT": "JUMP_BACKWARD",
    "LOAD_FAST_CHECK": "LOAD_FAST",
    "LOAD_METHOD": "LOAD_ATTR",  # 3.11 spells the method form of LOAD_ATTR this way
}


@dataclass(frozen=True)
class Instruction:
    """One bytecode instruction, normalized across Python versions."""

    index: int
    offset: int
    opname: str
    arg: int | None
    argval: object
    argrepr: str
    lineno: int | None
    target: int | None  # instruction index of the jump target, if this jumps
    method_load: bool  # LOAD_ATTR / LOAD_GLOBAL that also pushes NULL (or the self of a method)

    def __str__(self) -> str:
        return f"{self.offset:>4} {self.opname:<24} {self.argrepr}"


def _method_load(ins: dis.Instruction) -> bool:
    if ins.opname == "LOAD_METHOD":
        return True
    if ins.opname == "LOAD_GLOBAL":
        return bool(ins.arg & 1)
    if ins.opname == "LOAD_ATTR" and PY312:
        return bool(ins.arg & 1)
    if ins.opname == "LOAD_SUPER_ATTR":
        return bool(ins.arg & 1)
    return False


_LOAD_GLOBAL, _EXTENDED_ARG = dis.opmap["LOAD_GLOBAL"], dis.opmap["EXTENDED_ARG"]


def global_reads(code: types.CodeType) -> list[str]:
    """The names `code` itself reads with LOAD_GLOBAL (not those of functions inside it), in order, each once.

    Read off the raw code units, not through `dis`: a generated wrapper has thousands of instructions, and
    `dis` builds an object per instruction (and per inline cache entry). Since 3.11 the low bit of
    LOAD_GLOBAL's argument says whether it pushes NULL; the name index is the rest."""
    names: dict[str, None] = {}
    raw, extended = code.co_code, 0
    for i in range(0, len(raw), 2):
        op, arg = raw[i], raw[i + 1] | extended
        extended = arg << 8 if op == _EXTENDED_ARG else 0
        if op == _LOAD_GLOBAL:
            names[code.co_names[arg >> 1]] = None
    return list(names)


@cache
def instructions(code: types.CodeType) -> tuple[Instruction, ...]:
    """The instructions of `code`, with jump targets resolved to indices."""
    every = list(dis.get_instructions(code))
    raw = [i for i in every if i.opname not in ("CACHE", "EXTENDED_ARG")]
    index_of = {ins.offset: n for n, ins in enumerate(raw)}
    # A jump may land on the EXTENDED_ARG that prefixes its target: it means the next real instruction.
    for ins in reversed(every):
        if ins.offset not in index_of:
            index_of[ins.offset] = index_of.get(ins.offset + 2, len(raw) - 1)
    out = []
    lineno = code.co_firstlineno
    for n, ins in enumerate(raw):
        if ins.positions is not None and ins.positions.lineno is not None:
            lineno = ins.positions.lineno
        target = None
        if ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs:
            target = index_of[ins.argval]
            if PY312 and ins.opname == "FOR_ITER" and raw[target].opname == "END_FOR":
                target += 1  # 3.12 skips the END_FOR when the iterator is exhausted
        out.append(
            Instruction(
                index=n,
                offset=ins.offset,
                opname=_RENAMES.get(ins.opname, ins.opname),
                arg=ins.arg,
                argval=ins.argval,
                argrepr=ins.argrepr,
                lineno=lineno,
                target=target,
                method_load=_method_load(ins),
            )
        )
    return tuple(out)


def loops_back_after(code: types.CodeType, index: int) -> bool:
    """Whether a jump at or after instruction `index`, before the first return, goes back to it or before it:
    the instruction may be inside a loop. torch.compile's heuristic (`maybe_has_backedge`), which kiln follows
    so that it skips the frames torch.compile skips; a break at the loop's own `FOR_ITER` (an iterator from
    outside the graph) counts too, as torch.compile steps such an iterator without a break."""
    for ins in instructions(code)[index:]:
        if ins.opname in ("RETURN_VALUE", "RETURN_CONST"):
            return False
        if ins.target is not None and ins.target <= index:
            return True
    return False


def is_assert_jump(instrs: tuple[Instruction, ...], ins: Instruction) -> bool:
    """Whether `ins` is the jump of an `assert` statement: past it when true, else on to raise AssertionError
    (3.11 and 3.12 alike: `POP_JUMP_IF_TRUE` then `LOAD_ASSERTION_ERROR`, the message, `RAISE_VARARGS`)."""
    return (ins.opname == "POP_JUMP_IF_TRUE" and ins.index + 1 < len(instrs)
            and instrs[ins.index + 1].opname == "LOAD_ASSERTION_ERROR")


@dataclass(frozen=True)
class HandlerRange:
    """An exception-table entry: instructions [start, end) are protected by `target`."""

    start: int
    end: int
    target: int
    depth: int
    lasti: bool = False  # the handler expects the raising instruction's offset below the exception


@cache
def exception_ranges(code: types.CodeType) -> tuple[HandlerRange, ...]:
    """The exception table in instruction indices (try/except, with, and 3.12's inlined comprehensions)."""
    index_of = {ins.offset: ins.index for ins in instructions(code)}
    ranges = []
    for entry in dis.Bytecode(code).exception_entries:
        end = max((i for off, i in index_of.items() if off < entry.end), default=0) + 1
        ranges.append(HandlerRange(index_of.get(entry.start, 0), end, index_of[entry.target], entry.depth, entry.lasti))
    return tuple(ranges)


def handler_around(code: types.CodeType, index: int) -> HandlerRange | None:
    """The exception-table entry an exception raised at instruction `index` goes to (the first covering it, as
    CPython searches the table), or None: it leaves the frame."""
    return next((r for r in exception_ranges(code) if r.start <= index < r.end), None)


def handler_is_with_cleanup(code: types.CodeType, target: int) -> bool:
    """True when an exception handler is the cleanup of a `with` block (it starts by calling __exit__)."""
    ins = instructions(code)
    names = [i.opname for i in ins[target:target + 3]]
    return "WITH_EXCEPT_START" in names


def with_exits(code: types.CodeType, index: int) -> list[int]:
    """Where the `__exit__` of each `with` block around instruction `index` sits on the stack, innermost first:
    an exception raised there goes to the innermost block's cleanup, whose own code the next block's entry
    covers, and so on out."""
    exits, entry, seen = [], handler_around(code, index), set()
    while entry is not None and entry.target not in seen:
        seen.add(entry.target)
        if handler_is_with_cleanup(code, entry.target):
            exits.append(entry.depth - 1)
        entry = handler_around(code, entry.target)
    return exits


@cache
def has_try_block(code: types.CodeType) -> bool:
    """True when `code` has a user try/except or try/finally anywhere.

    A continuation that breaks inside one cannot run natively (a continuation is not a
    real frame), so a break anywhere in such a function runs the whole frame natively.
    """
    return any(in_try_block(code, r.start) for r in exception_ranges(code))


def in_try_block(code: types.CodeType, index: int) -> bool:
    """True when instruction `index` sits inside a user's try/except (not only inside a `with`)."""
    ins = instructions(code)
    for r in exception_ranges(code):
        if r.start <= index < r.end and not handler_is_with_cleanup(code, r.target):
            # a try/except handler starts with PUSH_EXC_INFO; 3.12's inlined comprehensions
            # protect their loop with a handler that starts with SWAP instead.
            if ins[r.target].opname == "PUSH_EXC_INFO":
                return True
    return False


def is_supported_python() -> bool:
    return sys.version_info[:2] in SUPPORTED_VERSIONS
