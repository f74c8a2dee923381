"""Operators: binary, comparison, identity, membership, unary, subscripts and strings."""
from __future__ import annotations

import operator

from kiln.capture.breaks import GraphBreak
from kiln.capture.opcodes.registry import opcode
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.containers import SliceValue
from kiln.capture.values.operators import BINARY_OPS, COMPARE_OPS, apply_operator, contains, identical
from kiln.capture.values.symbolic import SymValue

_UNARY = {"neg": operator.neg, "pos": operator.pos, "invert": operator.invert}


@opcode("BINARY_OP")
def binary_op(frame, ins):
    b, a = frame.pop(), frame.pop()
    frame.push(apply_operator(frame.state, BINARY_OPS[ins.argrepr], [a, b]))


@opcode("COMPARE_OP")
def compare_op(frame, ins):
    b, a = frame.pop(), frame.pop()
    frame.push(apply_operator(frame.state, COMPARE_OPS[ins.argval], [a, b]))


@opcode("IS_OP")
def is_op(frame, ins):
    b, a = frame.pop(), frame.pop()
    frame.push(ConstantValue(identical(frame.state, a, b) != bool(ins.arg)))


@opcode("CONTAINS_OP")
def contains_op(frame, ins):
    container, item = frame.pop(), frame.pop()
    frame.push(ConstantValue(contains(frame.state, container, item) != bool(ins.arg)))


def unary(frame, kind: str, value):
    return apply_operator(frame.state, _UNARY[kind], [value])


@opcode("UNARY_NEGATIVE")
def unary_negative(frame, ins):
    frame.push(unary(frame, "neg", frame.pop()))


@opcode("UNARY_POSITIVE", until=(3, 11))
def unary_positive(frame, ins):
    frame.push(unary(frame, "pos", frame.pop()))


@opcode("UNARY_INVERT")
def unary_invert(frame, ins):
    frame.push(unary(frame, "invert", frame.pop()))


@opcode("UNARY_NOT")
def unary_not(frame, ins):
    frame.push(ConstantValue(not frame.pop().truth(frame.state)))


@opcode("BINARY_SUBSCR")
def binary_subscr(frame, ins):
    key, container = frame.pop(), frame.pop()
    frame.push(container.realize().getitem(frame.state, key))


@opcode("STORE_SUBSCR")
def store_subscr(frame, ins):
    key, container, value = frame.pop(), frame.pop(), frame.pop()
    container.realize().setitem(frame.state, key, value)


@opcode("DELETE_SUBSCR")
def delete_subscr(frame, ins):
    key, container = frame.pop(), frame.pop()
    container.realize().delitem(frame.state, key)


@opcode("BUILD_SLICE")
def build_slice(frame, ins):
    step = frame.pop() if ins.arg == 3 else ConstantValue(None)
    stop, start = frame.pop(), frame.pop()
    frame.push(SliceValue(start, stop, step))


@opcode("BINARY_SLICE", since=(3, 12))
def binary_slice(frame, ins):
    stop, start, container = frame.pop(), frame.pop(), frame.pop()
    frame.push(container.realize().getitem(frame.state, SliceValue(start, stop, ConstantValue(None))))


@opcode("STORE_SLICE", since=(3, 12))
def store_slice(frame, ins):
    stop, start, container, value = frame.pop(), frame.pop(), frame.pop(), frame.pop()
    container.realize().setitem(frame.state, SliceValue(start, stop, ConstantValue(None)), value)


@opcode("FORMAT_VALUE")
def format_value(frame, ins):
    spec = frame.pop().as_constant() if (ins.arg & 0x04) else ""
    value = frame.pop().realize()
    if not value.is_constant() and not isinstance(value, SymValue):  # a symbolic size: its value, guarded
        raise GraphBreak("unsupported_object", f"formatting {value} into a string")
    v = value.as_constant()
    conversion = ins.arg & 0x03
    v = {0: v, 1: str(v), 2: repr(v), 3: ascii(v)}[conversion]
    frame.push(ConstantValue(format(v, spec)))


@opcode("BUILD_STRING")
def build_string(frame, ins):
    parts = frame.popn(ins.arg)
    frame.push(ConstantValue("".join(p.as_constant() for p in parts)))
