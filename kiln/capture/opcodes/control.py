"""Jumps, branches, loops and raise."""
from __future__ import annotations

import torch

from kiln.capture import bytecode
from kiln.capture.breaks import GraphBreak
from kiln.capture.opcodes.registry import Return, opcode
from kiln.capture.rerun import ASSERT_CHECK_MESSAGE
from kiln.capture.values.base import UnguardedValue
from kiln.capture.values.constant import ConstantValue
from kiln.capture.values.containers import IteratorValue
from kiln.capture.values.iterators import iterator_of
from kiln.capture.values.tensor import ItemValue, TensorValue, trace_op


@opcode("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_ABSOLUTE", "JUMP")
def jump(frame, ins):
    frame.jump(ins.target)


def is_none(value) -> bool:
    """`value is None` (the 3.11+ jumps on None); a value whose identity is not guarded (an input of a frame
    stepped through natively) may be None or not, so the jump runs natively."""
    value = value.realize()
    if isinstance(value, UnguardedValue):
        raise GraphBreak("unsupported_object", "`is None` on a value whose identity is not guarded")
    return value.is_constant() and value.as_constant() is None


@opcode("POP_JUMP_IF_FALSE")
def pop_jump_if_false(frame, ins):
    if not frame.peek().truth(frame.state):
        frame.jump(ins.target)
    frame.pop()


def _checked_in_graph(frame, ins) -> bool:
    """`assert cond[, msg]` on a one-element tensor (or on `t.item()`, values/items.py): a graph-side
    `torch._assert_async(cond)` instead of a branch, as torch.compile does. When it fails, the graph
    raises and the frame is re-run eagerly (capture/rerun.py), so the user gets eager's AssertionError
    with its message. Any other branch on a tensor's value stays a graph break."""
    if not bytecode.is_assert_jump(frame.instructions, ins):
        return False
    value = frame.peek().realize()
    tensor = value.tensor if isinstance(value, ItemValue) else value
    if not isinstance(tensor, TensorValue) or not isinstance(tensor.fake.numel(), int) or tensor.fake.numel() != 1:
        return False  # several values: `assert t` raises in eager, so let eager raise it
    trace_op(frame.state, "call_function", torch._assert_async, [tensor, ConstantValue(ASSERT_CHECK_MESSAGE)], {})
    frame.pop()
    frame.jump(ins.target)
    return True


@opcode("POP_JUMP_IF_TRUE")
def pop_jump_if_true(frame, ins):
    if _checked_in_graph(frame, ins):
        return
    if frame.peek().truth(frame.state):
        frame.jump(ins.target)
    frame.pop()


@opcode("POP_JUMP_IF_NONE")
def pop_jump_if_none(frame, ins):
    if is_none(frame.pop()):
        frame.jump(ins.target)


@opcode("POP_JUMP_IF_NOT_NONE")
def pop_jump_if_not_none(frame, ins):
    if not is_none(frame.pop()):
        frame.jump(ins.target)


@opcode("JUMP_IF_FALSE_OR_POP", until=(3, 11))
def jump_if_false_or_pop(frame, ins):
    if not frame.peek().truth(frame.state):
        frame.jump(ins.target)
    else:
        frame.pop()


@opcode("JUMP_IF_TRUE_OR_POP", until=(3, 11))
def jump_if_true_or_pop(frame, ins):
    if frame.peek().truth(frame.state):
        frame.jump(ins.target)
    else:
        frame.pop()


@opcode("GET_ITER", "GET_YIELD_FROM_ITER")
def get_iter(frame, ins):
    frame.push(iterator_of(frame.state, frame.pop()))  # iter(it) is it: they share its position


@opcode("FOR_ITER")
def for_iter(frame, ins):
    iterator = frame.peek().realize()
    if not isinstance(iterator, IteratorValue):
        raise GraphBreak("unsupported_object", f"iterating over {iterator}")
    value = iterator.next()
    if value is None:
        frame.pop()
        frame.jump(ins.target)
    else:
        frame.push(value)




@opcode("RETURN_GENERATOR")
def return_generator(frame, ins):
    """A placeholder for the generator object, for the POP_TOP that follows (the tracker is made by the call)."""
    frame.push(ConstantValue(None))


@opcode("YIELD_VALUE")
def yield_value(frame, ins):
    if not frame.is_generator:
        raise GraphBreak("unsupported_opcode", "yield outside a generator kiln models")
    frame.suspended = True  # resumed by the generator's next() or send(), which pushes the value sent in
    raise Return(frame.pop())


def _send(frame, ins) -> bool:
    """`yield from`: one step of the inner iterator; False once it is done."""
    frame.pop()  # the value sent in: passed on as next(), so only None is forwarded exactly
    iterator = frame.peek().realize()
    if not isinstance(iterator, IteratorValue):
        raise GraphBreak("unsupported_object", f"yield from {iterator}")
    value = iterator.next()
    if value is None:
        returned = getattr(iterator, "return_value", None)  # what an inner generator returned
        frame.push(returned if returned is not None else ConstantValue(None))
        frame.jump(ins.target)
        return False
    frame.push(value)
    return True


@opcode("SEND", until=(3, 11))
def send_311(frame, ins):
    """3.11: when the inner iterator is done, SEND pops it too and pushes its return value."""
    if not _send(frame, ins):
        value = frame.pop()
        frame.pop()
        frame.push(value)


@opcode("SEND", since=(3, 12))
def send_312(frame, ins):
    """3.12: the iterator stays below the return value until the END_SEND at the target."""
    _send(frame, ins)


@opcode("END_SEND", since=(3, 12))
def end_send(frame, ins):
    value = frame.pop()
    frame.pop()
    frame.push(value)
