"""Building and unpacking tuples, lists, sets and dicts."""
from __future__ import annotations

from kiln.capture.breaks import GraphBreak
from kiln.capture.opcodes.registry import opcode
from kiln.capture.values.containers import ListValue, SetValue, TupleValue, _key, _key_value
from kiln.capture.values.dicts import DictValue
from kiln.capture.values.exceptions import raise_python


@opcode("BUILD_TUPLE")
def build_tuple(frame, ins):
    frame.push(TupleValue(frame.popn(ins.arg)))


@opcode("BUILD_LIST")
def build_list(frame, ins):
    frame.push(ListValue(frame.popn(ins.arg)))


@opcode("BUILD_SET")
def build_set(frame, ins):
    frame.push(SetValue(frame.popn(ins.arg)))


@opcode("BUILD_MAP")
def build_map(frame, ins):
    items = frame.popn(2 * ins.arg)
    frame.push(DictValue({_key(frame.state, items[i]): items[i + 1] for i in range(0, len(items), 2)}))


@opcode("BUILD_CONST_KEY_MAP")
def build_const_key_map(frame, ins):
    keys = frame.pop().as_constant()
    values = frame.popn(ins.arg)
    frame.push(DictValue(dict(zip(keys, values))))


def _container_method(target, state, name: str, args: list) -> None:
    """`target.name(*args)` for a container tracker; a value kiln does not model (an opaque list a
    continuation stepping natively received) is a break, run natively by the output program."""
    if not hasattr(target, "call_method"):
        raise GraphBreak("unsupported_object", f"{name} on {target}")
    target.call_method(state, name, args, {})


@opcode("LIST_APPEND")
def list_append(frame, ins):
    value = frame.pop()  # through the list's method: a list from the user's world records the mutation
    _container_method(frame.peek(ins.arg).realize(), frame.state, "append", [value])


@opcode("SET_ADD")
def set_add(frame, ins):
    value = frame.pop()
    _container_method(frame.peek(ins.arg).realize(), frame.state, "add", [value])


@opcode("MAP_ADD")
def map_add(frame, ins):
    value, key = frame.pop(), frame.pop()
    frame.peek(ins.arg).realize().setitem(frame.state, key, value)


@opcode("LIST_EXTEND")
def list_extend(frame, ins):
    iterable = frame.pop()
    _container_method(frame.peek(ins.arg).realize(), frame.state, "extend", [iterable])


@opcode("SET_UPDATE")
def set_update(frame, ins):
    iterable = frame.pop()
    target = frame.peek(ins.arg).realize()
    if isinstance(target, SetValue):  # `{*a, *b}` and set literals of constants (a frozenset merged)
        target.update_from(frame.state, iterable)
        return
    for item in iterable.unpack(frame.state):
        _container_method(target, frame.state, "add", [item])


@opcode("DICT_UPDATE", "DICT_MERGE")
def dict_update(frame, ins):
    update = frame.pop().realize()
    if not isinstance(update, DictValue):
        raise GraphBreak("unsupported_object", f"** of {update}")
    target = frame.peek(ins.arg).realize()
    for key, value in update.pairs(frame.state):
        target.setitem(frame.state, _key_value(key), value)


@opcode("LIST_TO_TUPLE", until=(3, 11))
def list_to_tuple(frame, ins):
    frame.push(TupleValue(frame.pop().unpack(frame.state)))


@opcode("UNPACK_SEQUENCE")
def unpack_sequence(frame, ins):
    items = frame.pop().unpack(frame.state)
    if len(items) > ins.arg:
        raise raise_python(ValueError, f"too many values to unpack (expected {ins.arg})")
    if len(items) < ins.arg:
        raise raise_python(ValueError, f"not enough values to unpack (expected {ins.arg}, got {len(items)})")
    for item in reversed(items):
        frame.push(item)


@opcode("UNPACK_EX")
def unpack_ex(frame, ins):
    before, after = ins.arg & 0xFF, ins.arg >> 8
    items = frame.pop().unpack(frame.state)
    if len(items) < before + after:
        raise raise_python(ValueError, f"not enough values to unpack (expected at least {before + after}, "
                                       f"got {len(items)})")
    middle = ListValue(items[before:len(items) - after])
    for item in reversed(items[:before] + [middle] + items[len(items) - after:]):
        frame.push(item)
