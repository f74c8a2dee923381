"""Python operators (`+`, `<`, `not`, `in`, ...) on trackers.

One rule for all of them: a tensor operand makes the operator a graph node
(`operator.add(x, y)`), constant operands fold at capture time, containers
follow Python's own semantics, and a user object with a Python dunder method
has that method inlined.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.breaks import GraphBreak
from kiln.capture.guards import Guard, GuardKind
from kiln.capture.sources import ArithmeticSource
from kiln.capture.values.base import UnguardedValue, Value
from kiln.capture.values.constant import ConstantValue, ScalarInputValue, is_literal
from kiln.capture.values.containers import (
    IteratorValue,
    ListValue,
    SequenceValue,
    SetValue,
    SizeValue,
    TupleValue,
    from_constant,
    python_override,
)
from kiln.capture.values.exceptions import python_error
from kiln.capture.values.items import COMPARISONS, compare_items, item_arithmetic
from kiln.capture.values.symbolic import SymValue
from kiln.capture.values.tensor import ItemValue, TensorValue, trace_op

BINARY_OPS: dict[str, Callable] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
    "%": operator.mod, "**": operator.pow, "@": operator.matmul, "&": operator.and_, "|": operator.or_,
    "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift, ">>=": operator.irshift,
}
COMPARE_OPS: dict[str, Callable] = {
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, ">=": operator.ge,
}
_DUNDERS = {
    operator.add: ("__add__", "__radd__"), operator.sub: ("__sub__", "__rsub__"), operator.mul: ("__mul__", "__rmul__"),
    operator.truediv: ("__truediv__", "__rtruediv__"), operator.matmul: ("__matmul__", "__rmatmul__"),
    operator.eq: ("__eq__", "__eq__"), operator.getitem: ("__getitem__", None),
}
_INPLACE_TO_PLAIN = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
    operator.itruediv: operator.truediv, operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
    operator.ipow: operator.pow, operator.imatmul: operator.matmul, operator.iand: operator.and_,
    operator.ior: operator.or_, operator.ixor: operator.xor, operator.ilshift: operator.lshift,
    operator.irshift: operator.rshift,
}

def _setitem(state, container: Value, key: Value, value: Value) -> Value:
    container.setitem(state, key, value)
    return ConstantValue(None)


def _delitem(state, container: Value, key: Value) -> Value:
    container.delitem(state, key)
    return ConstantValue(None)


# `operator` functions that are statements or protocols rather than arithmetic: `xs[k] = v`, `del xs[k]`,
# `x is y`, `not x`. With a tensor among the arguments these still mean what the statement means.
_STATEMENTS: dict[Callable, Callable] = {
    operator.setitem: _setitem,
    operator.delitem: _delitem,
    operator.is_: lambda state, a, b: ConstantValue(identical(state, a, b)),
    operator.is_not: lambda state, a, b: ConstantValue(not identical(state, a, b)),
    operator.contains: lambda state, a, b: ConstantValue(contains(state, a, b)),
    operator.not_: lambda state, a: ConstantValue(not a.truth(state)),
    operator.truth: lambda state, a: ConstantValue(a.truth(state)),
}


def _as_graph_tensor(state, value: Value, partner: TensorValue) -> Value:
    """A number meeting tensor `partner` in arithmetic, as a 0-d float64 graph input where it is not a constant of
    the graph: a float input made dynamic, or a float computed from sizes (`x / math.sqrt(x.size(-1))`)."""
    if isinstance(value, SymValue) and value.python_type() is float:
        return _size_float_tensor(state, value, partner)
    if not isinstance(value, ScalarInputValue):
        return value
    zero_dim = partner.fake.dim() == 0
    if type(value.value) is float and partner.fake.dtype in (torch.bfloat16, torch.float16):
        # eager computes with a half-type tensor in float32 from the number itself, where kiln's kernels round a
        # 0-d tensor operand to the half type first: the number is specialized
        return value
    tensor = value.graph_tensor(partner.fake)
    if tensor is None:
        return value
    if zero_dim and _same_kind(partner.fake.dtype, tensor.fake.dtype):
        # A Python number takes a 0-d tensor's dtype (`t.sum() + x` stays float32), where a 0-d float64 or
        # int64 input would promote it: the number enters at the partner's dtype, as eager converts it.
        return trace_op(state, "call_method", "to", [tensor, ConstantValue(partner.fake.dtype)], {})
    return tensor


def _size_float_tensor(state, value: Value, partner: TensorValue) -> Value:
    """A float computed from sizes (`math.sqrt(n)`) meeting `partner`: a 0-d graph input of the dtype the number
    enters the arithmetic at, as eager converts a Python float: the partner's float32 or float64, the default
    dtype against an integer or bool tensor. Against a half type (eager computes from the number itself in
    float32, where kiln's kernels would round a 0-d tensor operand to the half type first) or a complex tensor it
    stays a symbolic float."""
    dtype = partner.fake.dtype
    if dtype.is_complex or dtype in (torch.float16, torch.bfloat16):
        return value
    target = dtype if dtype.is_floating_point else torch.get_default_dtype()
    tensor = state.size_float_tensor(value)
    return trace_op(state, "call_method", "to", [tensor, ConstantValue(target)], {}) if target != torch.float64 \
        else tensor


def _same_kind(partner: torch.dtype, number: torch.dtype) -> bool:
    """Whether a Python number of `number`'s kind (int64 or float64) is converted to `partner` in arithmetic
    with a 0-d tensor (a bool tensor promotes to the number's kind instead)."""
    if number.is_floating_point:
        return partner.is_floating_point and partner != number
    return partner != number and not partner.is_floating_point and not partner.is_complex and partner != torch.bool


_COMPARISON_SYMBOLS = {operator.lt: "<", operator.le: "<=", operator.gt: ">", operator.ge: ">=",
                       operator.eq: "==", operator.ne: "!="}


def _compare_scalar_inputs(state, fn: Callable, a: Value, b: Value) -> Value | None:
    """`n > 0` for an int or float from the user's world (`ScalarInputValue`) against a number or another
    such input: the outcome, guarded as the comparison itself, so a branch on it recompiles only when the
    outcome changes. None when an operand is anything else (it is then compared as usual)."""
    exprs = []
    for v in (a, b):
        if isinstance(v, ScalarInputValue):
            exprs.append(state.source_expr(v.source))
        elif type(v) is ConstantValue and v.source is None and type(v.value) in (int, float, bool) and is_literal(
                v.value):
            exprs.append(repr(v.value))
        else:
            return None
    outcome = fn(a.value, b.value)
    code = f"({exprs[0]} {_COMPARISON_SYMBOLS[fn]} {exprs[1]}) is {outcome}"
    source = a.source if isinstance(a, ScalarInputValue) else b.source
    state.guards.add(Guard(GuardKind.EQUALS_MATCH, source, code, f"{exprs[0]} {_COMPARISON_SYMBOLS[fn]} "
                           f"{exprs[1]} is {outcome}", f"{exprs[0]} {_COMPARISON_SYMBOLS[fn]} {exprs[1]}"))
    return ConstantValue(outcome)


# Integer arithmetic whose result is an int input's function: `n % 2` stays tied to `n` (`_scalar_arithmetic`).
_INT_ARITHMETIC = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.floordiv: "//",
                   operator.mod: "%", operator.lshift: "<<", operator.rshift: ">>", operator.and_: "&",
                   operator.or_: "|", operator.xor: "^"}


def _scalar_arithmetic(state, fn: Callable, a: Value, b: Value) -> Value | None:
    """`n % 2` for an int input `n` and an int literal: an int input of its own, whose source is the expression.

    Where its value is then read (`x.sum(dim=n % 2)`), the guard is `(n % 2) == 1` rather than `n == 3`, so the
    next `n` with the same remainder reuses the entry, as torch.compile's guard on its SymInt expression does.
    None when the operands are anything else, or Python raises (they are then combined as usual)."""
    scalar = a if isinstance(a, ScalarInputValue) else b
    literal = b if scalar is a else a
    if not (isinstance(scalar, ScalarInputValue) and type(scalar.value) is int and type(literal) is ConstantValue
            and literal.source is None and type(literal.value) is int):
        return None
    try:
        value = fn(a.value, b.value)
    except Exception:
        return None
    symbol = _INT_ARITHMETIC[fn]
    template = f"({{}} {symbol} {literal.value!r})" if scalar is a else f"({literal.value!r} {symbol} {{}})"
    source = ArithmeticSource(scalar.source, template)
    expr = state.source_expr(source)

    def guard_value():
        state.guards.add(Guard(GuardKind.EQUALS_MATCH, scalar.source, f"{expr} == {value!r}", repr(value), expr))
        if scalar.origin is not None:  # the input changing then makes it dynamic, as `n` read itself
            state.specialized_scalars.append(scalar.origin)

    return ScalarInputValue(value, source, guard_value, origin=scalar.origin)


def _symbolic_arithmetic(state, fn: Callable, args: list[Value]) -> Value | None:
    """`n * 2`, `n < m`, `-n` over a symbolic number and other numbers: a graph node, the result symbolic.
    None where Python needs the number itself (`[0] * n`, `"%d" % n`, `~n`, which a SymInt does not model):
    the caller then specializes it (a guard on its value), as torch.compile does."""
    if not all(isinstance(a, SymValue) or (a.is_constant() and type(a.as_constant()) in (int, float, bool))
               for a in args):
        return None
    try:
        return trace_op(state, "call_function", fn, args, {})
    except GraphBreak as e:
        if e.reason.id != "exception":
            raise
        return None  # the fake run raised (no such SymInt operator, a division by zero): Python decides


# Set operators as the set methods they are; the shadow set in `SetValue` runs them.
_SET_DUNDERS = {
    operator.or_: "__or__", operator.and_: "__and__", operator.sub: "__sub__", operator.xor: "__xor__",
    operator.ior: "__ior__", operator.iand: "__iand__", operator.isub: "__isub__", operator.ixor: "__ixor__",
    operator.eq: "__eq__", operator.ne: "__ne__", operator.le: "__le__", operator.lt: "__lt__",
    operator.ge: "__ge__", operator.gt: "__gt__",
}


def apply_operator(state, fn: Callable, args: list[Value]) -> Value:
    """`fn(*args)` for an `operator` function: graph node, folded constant, or Python semantics."""
    from kiln.capture.values.dicts import DictValue

    args = [a.realize() for a in args]
    if any(isinstance(a, ItemValue) for a in args):  # `t.item() <= n` under fullgraph=True
        if fn in COMPARISONS and len(args) == 2:
            return compare_items(state, fn, *args)
        combined = item_arithmetic(state, fn, args)
        if combined is not None:
            return combined
        raise GraphBreak("tensor_to_python", f"Tensor.item() used with operator.{fn.__name__}")
    if fn in _COMPARISON_SYMBOLS and any(isinstance(a, ScalarInputValue) for a in args):
        outcome = _compare_scalar_inputs(state, fn, *args)
        if outcome is not None:
            return outcome
    if fn in _INT_ARITHMETIC and len(args) == 2 and any(isinstance(a, ScalarInputValue) for a in args):
        derived = _scalar_arithmetic(state, fn, *args)
        if derived is not None:
            return derived
    partner = next((a for a in args if isinstance(a, TensorValue)), None)
    if partner is not None:  # `x * n` for a number n made dynamic: n as a 0-d tensor input
        args = [_as_graph_tensor(state, a, partner) for a in args]
    if fn in _STATEMENTS:  # the statements' own handlers: a container's semantics, or a tensor's in-place write
        return _STATEMENTS[fn](state, *args)
    if fn is operator.getitem:
        return args[0].getitem(state, args[1])  # operator.getitem(xs, i) is xs[i], whatever xs is
    if fn in _INPLACE_TO_PLAIN and not isinstance(args[0], TensorValue) and (
            isinstance(args[0], SymValue)
            or args[0].is_constant() and type(args[0].as_constant()) in (int, float, bool)):
        fn = _INPLACE_TO_PLAIN[fn]  # `n += t` with a Python number n: numbers have no __iadd__, Python does `n + t`
    if any(isinstance(a, SymValue) for a in args) and not any(isinstance(a, TensorValue) for a in args):
        symbolic = _symbolic_arithmetic(state, fn, args)
        if symbolic is not None:
            return symbolic
        args = [ConstantValue(a.as_constant()) if isinstance(a, SymValue) else a for a in args]
    if any(isinstance(a, (TensorValue, SymValue)) for a in args):
        return trace_op(state, "call_function", fn, args, {})
    operand = _operand_returned(_INPLACE_TO_PLAIN.get(fn, fn), args)
    if operand is not None:
        return operand
    in_place = fn in _INPLACE_TO_PLAIN and isinstance(args[0], (ListValue, SetValue))
    if all(a.is_constant() for a in args) and not in_place and not any(isinstance(a, DictValue) for a in args):
        # An in-place operator on a list or set mutates it (and every alias of it); a dict keeps its kind
        # (`dicts`). Any other result is new: a list or set comes back as a tracker, built per call.
        try:
            return from_constant(fn(*(a.as_constant() for a in args)))
        except Exception as e:
            raise python_error(e, fn.__name__) from e
    plain = _INPLACE_TO_PLAIN.get(fn, fn)
    if isinstance(args[0], SetValue) and fn in _SET_DUNDERS:
        return args[0].call_method(state, _SET_DUNDERS[fn], args[1:], {})  # `s -= t` mutates s and its aliases
    if isinstance(args[0], DictValue) and len(args) <= 2:
        override = _dict_subclass_operator(state, fn, plain, args[0], args[1:])
        if override is not None:
            return override
        if len(args) == 2:
            return _dict_operator(state, fn, plain, args[0], args[1])
    a = b = None
    if len(args) == 2 and any(isinstance(a, SequenceValue) for a in args):
        a, b = (_as_sequence(a) for a in args)
    if len(args) == 2 and isinstance(a, SequenceValue):
        if plain is operator.add and isinstance(b, SequenceValue):
            if fn is operator.iadd and isinstance(a, ListValue):
                a.call_method(state, "extend", [b], {})
                return a
            return type(a)(a.items + b.items) if isinstance(a, ListValue) else TupleValue(a.items + b.items)
        if plain is operator.mul and b.is_constant():
            items = _repeated(a.items, b.as_constant())
            if fn is operator.imul and isinstance(a, ListValue):
                a.items[:] = items
                a.mutated(state)
                return a
            return ListValue(items) if isinstance(a, ListValue) else TupleValue(items)
        if plain in (operator.eq, operator.ne) and isinstance(b, SequenceValue):
            # item by item as Python compares them: the same object is equal without asking (a tensor too); a
            # list is never equal to a tuple
            same = isinstance(a, ListValue) == isinstance(b, ListValue) and len(a.items) == len(b.items) and all(
                identical(state, x, y) or apply_operator(state, operator.eq, [x, y]).truth(state)
                for x, y in zip(a.items, b.items))
            return ConstantValue(same if plain is operator.eq else not same)
    return _dunder(state, plain, args)


def _repeated(items: list[Value], count: Any) -> list[Value]:
    """`seq * count` on the sequence's trackers: they are as many as its items, so Python raises what eager
    raises (MemoryError for a length past the address space, TypeError for a count that is no int), and that
    exception is the user's, catchable by traced code, not a failure of capture."""
    try:
        return items * count
    except Exception as e:
        raise python_error(e, "*") from e


def _operand_returned(plain: Callable, args: list[Value]) -> Value | None:
    """The operand itself where CPython returns it rather than an equal copy (`t * 1`, `t + ()`, `'' + s` for an
    exact tuple, str or bytes), so `id()` and `is` see one object, as in eager."""
    if len(args) != 2 or plain not in (operator.mul, operator.add):
        return None
    for kept, other in ((args[0], args[1]), (args[1], args[0])):
        if not _exact_immutable_sequence(kept) or not other.is_constant():
            continue
        value = other.as_constant()
        if plain is operator.mul and type(value) is int and value == 1:
            return kept
        if plain is operator.add and type(value) is kept.python_type() and len(value) == 0:
            return kept
    return None


def _exact_immutable_sequence(v: Value) -> bool:
    if isinstance(v, TupleValue):
        return v.python_type() is tuple
    return v.is_constant() and type(v.as_constant()) in (tuple, str, bytes)


def _dict_subclass_operator(state, fn: Callable, plain: Callable, a, others: list[Value]) -> Value | None:
    """A dict subclass's own Python method for the operator (Counter's `|`, `&`, `-`, `<=`, unary `-`, and
    its `==` ignoring zero counts), inlined; an in-place operator tries its own method (`__ior__`) first, as Python
    does. None where the class leaves the operator to dict."""
    names = [f"__{f.__name__.rstrip('_')}__" for f in dict.fromkeys((fn, plain))]  # operator.or_ -> __or__
    for name in names:
        if python_override(a.cls, dict, name) is not None:
            result = a.getattr(state, name).call(state, list(others), {})
            if not (result.is_constant() and result.as_constant() is NotImplemented):
                return result
            if name == names[-1]:
                raise GraphBreak("unsupported_object", f"{a.cls.__name__}.{name} returned NotImplemented")
    return None


def _dict_operator(state, fn: Callable, plain: Callable, a, b: Value) -> Value:
    """`==`, `!=`, `|` and `|=` on dicts, as the dict types define them (see `dicts`)."""
    from kiln.capture.values.dicts import DictValue, equal, merged

    if plain in (operator.eq, operator.ne):
        same = isinstance(b, DictValue) and equal(state, a, b)
        return ConstantValue(same if plain is operator.eq else not same)
    if fn is operator.ior:
        return a.call_method(state, "__ior__", [b], {})
    if plain is operator.or_:
        return merged(state, a, b)
    return _dunder(state, plain, [a, b])


def _as_sequence(value: Value) -> Value:
    """A constant tuple or list as a sequence tracker, so `(x, 1) + (2,)` mixes the two kinds."""
    if isinstance(value, ConstantValue) and type(value.as_constant()) in (tuple, list, torch.Size):
        items = [ConstantValue(v) for v in value.as_constant()]
        if isinstance(value.as_constant(), torch.Size):  # `x.shape == (n,)` of a static shape and a symbol
            return SizeValue(items)
        return ListValue(items) if isinstance(value.as_constant(), list) else TupleValue(items)
    return value


def _dunder(state, fn: Callable, args: list[Value]) -> Value:
    """A user object's Python operator method, inlined."""
    names = _DUNDERS.get(fn)
    if names:
        for value, name, other in ((args[0], names[0], args[1:]), (args[-1], names[1], args[:1])):
            if name is None:
                continue
            method = getattr(value.python_type(), name, None)
            if method is not None and hasattr(method, "__code__"):
                return value.getattr(state, name).call(state, list(other), {})
    # objects whose equality is object's own compare by identity; a C type's own __eq__ (functools'
    # KeyWrapper, Decimal) decides for itself, and kiln cannot answer for it
    if fn in (operator.eq, operator.ne) and all(_identity_equality(a.python_type()) for a in args):
        same = identical(state, args[0], args[1])
        return ConstantValue(same if fn is operator.eq else not same)
    raise GraphBreak("unsupported_object", f"operator {fn.__name__} on {', '.join(map(repr, args))}")


def _identity_equality(cls: type) -> bool:
    """Whether `==` and `!=` between instances of `cls` and others fall back to identity (object's own)."""
    return getattr(cls, "__eq__", None) is object.__eq__ and getattr(cls, "__ne__", None) is object.__ne__


def identical(state, a: Value, b: Value) -> bool:
    """`a is b` when capture can tell; otherwise a break.

    Two objects of the user's world (inputs, attributes) compared by identity: the answer is guarded,
    both ways (`f(x, x)` after `f(x, y)` compiled `a is b` as False).
    """
    a, b = a.realize(), b.realize()
    if a is b:
        return True
    if isinstance(a, UnguardedValue) or isinstance(b, UnguardedValue):
        raise GraphBreak("unsupported_object", "`is` on a value whose identity is not guarded")
    both_constants = isinstance(a, ConstantValue) and isinstance(b, ConstantValue)
    if a.source is not None and b.source is not None and not both_constants:
        same = state.real_value(a.source) is state.real_value(b.source)  # two sources, one object (tied weights)
        return _guard_identity(state, a, b, same)
    if isinstance(a, TensorValue) and isinstance(b, TensorValue):
        return a.node is b.node
    if a.is_constant() and b.is_constant():
        return a.as_constant() is b.as_constant()
    obj_a, obj_b = _object_of(a), _object_of(b)
    if obj_a is not _MISSING and obj_b is not _MISSING:  # a constant against a tracked real object, too
        return _guard_identity(state, a, b, obj_a is obj_b)
    if a.is_constant() != b.is_constant() or isinstance(a, TensorValue) != isinstance(b, TensorValue):
        return False
    return type(a) is type(b) and a is b


def _guard_identity(state, a: Value, b: Value, same: bool) -> bool:
    """The identity of two objects found by source holds only while they are (or are not) one object; so does
    that of an object found by source and one capture holds (a module is guarded by its class, not itself)."""
    if a.source is not None and b.source is not None and a.source != b.source:
        ea, eb = state.source_expr(a.source), state.source_expr(b.source)
    elif (a.source is None) != (b.source is None):
        sourced, held = (a, b) if a.source is not None else (b, a)
        if isinstance(sourced, ConstantValue):  # guarded by value already
            return same
        ea, eb = state.source_expr(sourced.source), state.guards.constant(_object_of(held), "obj")
    else:
        return same
    check = f"{ea} is {eb}" if same else f"not ({ea} is {eb})"
    state.guards.add(Guard(GuardKind.ID_MATCH, a.source or b.source, check,
                           f"{'' if same else 'not '}the same object as {eb}",
                           f"'the same object' if {ea} is {eb} else 'a different object'"))
    return same


_MISSING = object()


def _object_of(v: Value):
    """The real Python object behind a tracker, when it has one (a constant, a module, a class...)."""
    if isinstance(v, ConstantValue):
        return v.as_constant()
    return getattr(v, "obj", _MISSING)


def contains(state, container: Value, item: Value) -> bool:
    container = container.realize()
    from kiln.capture.values.dicts import DictValue, DictViewValue

    if isinstance(container, TensorValue):
        raise GraphBreak("data_dependent_branch", "`in` on a tensor")
    if isinstance(container, (DictValue, SetValue)):
        return container.call_method(state, "__contains__", [item], {}).as_constant()
    if isinstance(container, DictViewValue) and container.kind == "keys":
        return contains(state, container.dict, item)
    if isinstance(item.realize(), TensorValue):
        return _tensor_in_sequence(state, container, item)
    if container.is_constant():
        try:
            return item.as_constant() in container.as_constant()
        except Exception as e:  # `None in None`: eager's TypeError, the user's to catch
            raise python_error(e, "in") from e
    return any(identical(state, item, x) or (item.realize().is_constant() and x.realize().is_constant()
                                      and item.as_constant() == x.as_constant())
               for x in _items_of(state, container))


def _items_of(state, container: Value):
    """The items `in` compares, one at a time: `x in iterator` stops consuming it at the first match."""
    if not isinstance(container, IteratorValue):
        yield from container.unpack(state)
        return
    while (value := container.next()) is not None:
        yield value


def _tensor_in_sequence(state, container: Value, item: Value) -> bool:
    """`t in [a, t]`: Python tries identity first, so it is known until an element needs `==`."""
    for x in _items_of(state, container):
        if identical(state, item, x):
            return True
        if isinstance(x.realize(), TensorValue) or not x.realize().is_constant() or x.as_constant() is not None:
            raise GraphBreak("data_dependent_branch", "`in` compares a tensor by value")
    return False
