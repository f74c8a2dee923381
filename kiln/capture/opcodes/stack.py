"""Stack shuffling, constants, returns and no-ops."""
from __future__ import annotations

from kiln.capture.opcodes.registry import Return, opcode
from kiln.capture.values.base import NULL
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.functions import CellValue


@opcode("NOP", "RESUME", "PRECALL", "COPY_FREE_VARS", "CACHE", "EXTENDED_ARG")
def nop(frame, ins):
    pass


@opcode("POP_TOP")
def pop_top(frame, ins):
    frame.pop()


@opcode("PUSH_NULL")
def push_null(frame, ins):
    frame.push(NULL)


@opcode("COPY")
def copy(frame, ins):
    frame.push(frame.peek(ins.arg))


@opcode("SWAP")
def swap(frame, ins):
    s = frame.stack
    s[-1], s[-ins.arg] = s[-ins.arg], s[-1]


@opcode("END_FOR", since=(3, 12))
def end_for(frame, ins):
    frame.popn(2)


@opcode("LOAD_CONST")
def load_const(frame, ins):
    frame.push(ConstantValue(ins.argval))


@opcode("RETURN_VALUE")
def return_value(frame, ins):
    raise Return(frame.pop())


@opcode("RETURN_CONST", since=(3, 12))
def return_const(frame, ins):
    raise Return(ConstantValue(ins.argval))


@opcode("MAKE_CELL")
def make_cell(frame, ins):
    frame.cells[ins.argval] = CellValue(contents=frame.locals.pop(ins.argval, None))
