"""Python builtins, `math` and `operator` during capture: one handler per function, in a table.

Builtins on constants fold; builtins that only shuffle values (len, zip,
enumerate, isinstance) are answered from the trackers; anything with a side
effect (print) or an unmodelled C function is a graph break.
"""
from __future__ import annotations

import builtins
import collections
import copy
import functools
import inspect
import itertools
import operator
import sys
import types
import typing
import warnings
from collections.abc import Callable
from typing import Any

import torch

from kiln.capture.breaks import GraphBreak
from kiln.capture.side_effects import is_deleted
from kiln.capture.values import copies
from kiln.capture.values.base import Value
from kiln.capture.values.classes import function_value
from kiln.capture.values.constant import ConstantValue, is_literal
from kiln.capture.values.containers import (
    IteratorValue,
    ListValue,
    SetValue,
    SliceValue,
    TupleValue,
    from_constant,
    sort_keys,
    sort_order,
)
from kiln.capture.values.deferred import deferred_warn
from kiln.capture.values.deques import DequeValue
from kiln.capture.values.dicts import DictValue, fromkeys, update_pairs
from kiln.capture.values.exceptions import TracedException, python_error, raise_python
from kiln.capture.values.functions import BuiltinValue, FunctionValue, MethodValue, update_wrapper
from kiln.capture.values.iterators import (
    ChainValue,
    CountValue,
    EnumerateValue,
    FilterValue,
    IsliceValue,
    MapValue,
    PairwiseValue,
    RepeatValue,
    WhileValue,
    ZipValue,
    iterator_of,
    reversed_of,
    stop_iteration,
)
from kiln.capture.values.objects import ClassValue, PartialValue, SuperValue
from kiln.capture.values.operators import apply_operator
from kiln.capture.values.polyfills import POLYFILLS
from kiln.capture.values.symbolic import SymValue
from kiln.capture.values.symbolic_math import SYMBOLIC_MATH, symbolic_math
from kiln.capture.values.tensor import TensorValue, trace_op

HANDLERS: dict[Any, Callable] = {}
_PLAIN_DICTS = (dict, collections.OrderedDict, collections.defaultdict)


def handles(*fns):
    def register(handler):
        for fn in fns:
            HANDLERS[fn] = handler
        return handler

    return register


def call_builtin(state, fn: Any, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if fn in HANDLERS:
        try:
            return HANDLERS[fn](state, *args, **kwargs)
        except TypeError as e:
            if e.__traceback__.tb_next is None:  # the arguments did not bind to the handler: a form it does not
                # model (type(name, bases, ns), iter(f, sentinel)) runs natively; one eager rejects raises
                raise _rejected_arguments(fn, args, kwargs) or GraphBreak(
                    "unsupported_call", f"{getattr(fn, '__qualname__', fn)}() with these arguments") from e
            raise
    if getattr(fn, "__module__", None) in ("math", "cmath") or fn in vars(operator).values():
        if getattr(fn, "__module__", None) == "_operator" or fn in vars(operator).values():
            rejected = _rejected_arguments(fn, args, kwargs)
            if rejected is not None:
                raise rejected
            return apply_operator(state, fn, args)
        return _fold(fn, args, kwargs)
    if getattr(fn, "__self__", None) is not None and isinstance(fn.__self__, (str, int, float, tuple, bytes)):
        return _fold(fn, args, kwargs)  # 'a,b'.split(...), (1).bit_length()
    module = getattr(fn, "__module__", "") or ""
    if module.startswith("numpy") or type(getattr(fn, "__self__", None)).__module__.startswith("numpy"):
        raise GraphBreak("numpy", f"{getattr(fn, '__name__', fn)}()")
    raise GraphBreak("unsupported_call", f"{getattr(fn, '__qualname__', fn)}()")


def _rejected_arguments(fn: Callable, args: list[Value], kwargs: dict[str, Value]) -> TracedException | None:
    """The TypeError eager raises when `args` do not fit `fn`'s signature (`operator.is_()`), else None.

    A C function checks its argument count before it reads any argument, so calling it with placeholders of
    the same number and names raises eager's own message without doing anything."""
    try:
        inspect.signature(fn).bind(*args, **kwargs)
        return None
    except ValueError:  # no signature to check against: the caller decides
        return None
    except TypeError as binding:
        try:
            fn(*(object() for _ in args), **{k: object() for k in kwargs})
        except TypeError as e:
            return raise_python(TypeError, *e.args)
        except Exception:
            pass
        return raise_python(TypeError, str(binding))


def _fold(fn: Callable, args: list[Value], kwargs: dict[str, Value]) -> Value:
    if any(isinstance(a.realize(), TensorValue) for a in args):
        raise GraphBreak("tensor_to_python", f"{getattr(fn, '__name__', fn)}() on a tensor")
    if any(isinstance(a.realize(), DictValue) and a.realize().cls not in _PLAIN_DICTS for a in args):
        # a dict subclass's constant is a plain dict: repr(Counter(...)) would lose what the class adds
        raise GraphBreak("unsupported_call", f"{getattr(fn, '__name__', fn)}() of a dict subclass")
    try:
        return from_constant(fn(*(a.as_constant() for a in args), **{k: v.as_constant() for k, v in kwargs.items()}))
    except GraphBreak:
        raise
    except Exception as e:
        raise python_error(e, getattr(fn, "__name__", repr(fn))) from e


def _constant_fold(*fns):
    for fn in fns:
        HANDLERS[fn] = lambda state, *args, _fn=fn, **kwargs: _fold(_fn, list(args), kwargs)


_constant_fold(builtins.divmod, builtins.pow, builtins.hash, builtins.repr, builtins.format,
               builtins.ord, builtins.chr, builtins.hex, builtins.bin, builtins.complex)
# Pure functions of (immutable) annotations, as used by dataclass validators.
_constant_fold(typing.get_origin, typing.get_args)


@handles(builtins.print)
def _print(state, *args, **kwargs):
    raise GraphBreak("print", "print()")


@handles(warnings.warn)
def _warn(state, *args, **kwargs):
    return deferred_warn(state, *args, **kwargs)


@handles(inspect.signature)
def _signature(state, fn, **options):
    """`inspect.signature(f)` of a function capture can name: computed on the real function.

    A signature depends only on the function object (code, defaults, annotations,
    `__wrapped__`), whose identity the capture already relies on.
    """
    real = _real_callable(fn.realize())
    if real is None:
        raise GraphBreak("unsupported_call", "inspect.signature of a function made during capture")
    return ConstantValue(inspect.signature(real, **{k: v.as_constant() for k, v in options.items()}))


def _real_callable(value: Value) -> Any:
    if isinstance(value, MethodValue):
        func = _real_callable(value.fn.realize())
        return None if func is None else types.MethodType(func, _SignatureSelf())
    if isinstance(value, FunctionValue):
        return value.real
    return getattr(value, "obj", None) if callable(getattr(value, "obj", None)) else None


class _SignatureSelf:
    """Stands for `self` when asking a method's signature: the signature never looks at it."""


@handles(builtins.len)
def _len(state, obj):
    obj = obj.realize()
    if isinstance(obj, TensorValue):  # a dynamic first dimension stays symbolic
        return obj.len_value(state)
    return ConstantValue(obj.length(state))


@handles(builtins.isinstance)
def _isinstance(state, obj, classes):
    return _subclass_check(state, obj.realize().python_type(), classes.as_constant())


@handles(builtins.issubclass)
def _issubclass(state, cls, classes):
    return _subclass_check(state, cls.as_constant(), classes.as_constant())


def _subclass_check(state, cls: type, classes) -> Value:
    """`issubclass(cls, classes)`, asked of the real classes. An ABC's check reads the class's attributes
    (`Sized` looks for `__len__`) and caches its answer on the ABC for good: while traced code has attribute
    writes of `cls` not yet replayed (`setattr(C, '__len__', f)`), asking now would answer for the class
    before the write and poison that cache, so the check runs natively after the writes."""
    targets = classes if isinstance(classes, tuple) else (classes,)
    if isinstance(cls, type) and any(
            getattr(type(t), "__subclasscheck__", None) is not type.__subclasscheck__ for t in targets) and any(
            state.side_effects.instance_attrs(klass) for klass in cls.__mro__):
        raise GraphBreak("unsupported_call", f"issubclass({cls.__name__}, ...) of a class with attribute writes "
                         "not replayed yet")
    return ConstantValue(issubclass(cls, classes))


@handles(builtins.type)
def _type(state, obj):
    return ClassValue(obj.realize().python_type())


@handles(types.MethodType)
def _bind_method(state, fn, obj):
    """`types.MethodType(fn, obj)` (contextlib.ExitStack binds each `__exit__` so): `fn` bound to `obj`."""
    fn = fn.realize()
    if not isinstance(fn, FunctionValue):
        raise GraphBreak("unsupported_call", f"types.MethodType({fn}, ...)")
    return MethodValue(obj, fn)


@handles(sys.exc_info)
def _exc_info(state):
    """The exception the traced code is handling (an `except` block, a `with` block's `__exit__`), innermost
    frame first; kiln does not see one its caller handles, so that case is not traced."""
    for frame in reversed(state.frames):
        if frame.handled and frame.handled[-1] is not None:
            exc = frame.handled[-1]
            return TupleValue([ClassValue(exc.python_type()), exc, ConstantValue(None)])
    if sys.exc_info()[1] is not None:
        raise GraphBreak("unsupported_call", "sys.exc_info() while the caller handles an exception")
    return TupleValue([ConstantValue(None)] * 3)


@handles(collections.namedtuple)
def _make_namedtuple(state, typename, field_names, **options):
    """`collections.namedtuple(...)` with constant arguments, made at capture time: the class is created
    once per capture and the program returns instances of it (eager makes a new class per call)."""
    module = options.pop("module", None)
    module = module.as_constant() if module is not None else state.current_frame().globals.get("__name__")
    try:
        cls = collections.namedtuple(typename.as_constant(), field_names.as_constant(), module=module,
                                     **{k: v.as_constant() for k, v in options.items()})
    except (ValueError, TypeError) as e:  # a name that is not an identifier, a duplicate field: eager's error
        raise python_error(e, "namedtuple") from e
    return ClassValue(cls)


def _copier(fn: Callable):
    """`copy.copy` / `copy.deepcopy`: a copy of an immutable literal (a number, a string, a tuple of them) is the
    literal itself, as the copy module returns it; anything else runs the copy module's Python code, inlined."""
    def handler(state, value, *rest, **kwargs):
        if value.is_constant() and is_literal(value.as_constant()):
            return value
        return state.inline(function_value(state, fn), [value, *rest], kwargs)

    return handler


HANDLERS[copy.copy], HANDLERS[copy.deepcopy] = _copier(copy.copy), _copier(copy.deepcopy)


@handles(builtins.callable)
def _callable(state, obj):
    """Python asks the object's type for a `__call__` slot; `hasattr(cls, "__call__")` would also find
    the metaclass's (every class has one), calling any instance callable."""
    cls = obj.realize().python_type()
    return ConstantValue(any("__call__" in klass.__dict__ for klass in cls.__mro__))


def _attribute_name(name: Value) -> str:
    """The name getattr, hasattr, setattr and delattr take: a str, else eager's TypeError (the user's)."""
    value = name.as_constant()
    if not isinstance(value, str):
        raise raise_python(TypeError, f"attribute name must be string, not {type(value).__name__!r}")
    return value


@handles(builtins.getattr)
def _getattr(state, obj, name, *default):
    try:
        return obj.getattr(state, _attribute_name(name))
    except GraphBreak as e:
        if default and _is_attribute_error(e):
            return default[0]
        raise


def _is_attribute_error(e: GraphBreak) -> bool:
    """getattr(o, n, default) and hasattr swallow AttributeError only: a KeyError from a property propagates."""
    return isinstance(e, TracedException) and issubclass(e.value.cls, AttributeError)


@handles(builtins.hasattr)
def _hasattr(state, obj, name):
    value, key = obj.realize(), _attribute_name(name)
    real = getattr(value, "obj", None)
    if real is not None:
        pending = state.side_effects.pending_attr(real, key)  # set or deleted earlier in this capture
        if pending is not None:
            return ConstantValue(not is_deleted(pending))
        present = hasattr(real, key)
        state.guard_hasattr(value.source, key, present)
        return ConstantValue(present)
    try:
        obj.getattr(state, name.as_constant())
        return ConstantValue(True)
    except GraphBreak as e:
        if _is_attribute_error(e):
            return ConstantValue(False)
        raise


@handles(builtins.setattr)
def _setattr(state, obj, name, value):
    obj.setattr(state, _attribute_name(name), value)
    return ConstantValue(None)


@handles(builtins.delattr)
def _delattr(state, obj, name):
    obj.delattr(state, _attribute_name(name))
    return ConstantValue(None)


def _is_empty(state, cell) -> bool:
    """A cell not assigned yet (locals() leaves its name out); a store traced earlier in this capture counts."""
    if cell.contents is not None:
        return False
    if cell.real is None:
        return True
    pending = state.side_effects.pending_attr(cell.real, "cell_contents")
    if pending is not None:
        return is_deleted(pending)
    try:
        _ = cell.real.cell_contents
    except ValueError:
        return True
    return False


@handles(builtins.dir)
def _dir(state, *args):
    """`dir()`: the sorted names of the calling frame's locals (with an object, it runs natively)."""
    if args:
        raise GraphBreak("unsupported_call", "dir(obj)")
    return ListValue([ConstantValue(name) for name in sorted(_locals(state).items)])


@handles(builtins.vars)
def _vars(state, obj=None):
    if obj is None:  # the calling frame's locals()
        return _locals(state)
    return obj.getattr(state, "__dict__")


@handles(builtins.range)
def _range(state, *args):
    return ConstantValue(range(*(a.as_constant() for a in args)))


@handles(builtins.enumerate)
def _enumerate(state, iterable, start=None):
    return EnumerateValue(state, iterator_of(state, iterable), start.as_constant() if start is not None else 0)


@handles(builtins.zip)
def _zip(state, *iterables, strict=None):
    return ZipValue(state, [iterator_of(state, it) for it in iterables], bool(strict and strict.as_constant()))


@handles(builtins.reversed)
def _reversed(state, seq):
    return reversed_of(state, seq)


@handles(builtins.iter)
def _iter(state, obj):
    return iterator_of(state, obj)


@handles(builtins.next)
def _next(state, it, *default):
    it = it.realize()
    if not isinstance(it, IteratorValue):
        raise GraphBreak("unsupported_object", f"next() on {it}")
    value = it.next()
    if value is None:
        if default:
            return default[0]
        raise stop_iteration(it)
    return value


def _polyfilled(fn):
    """Traced calls of `fn` run its pure-Python stand-in (values/polyfills.py), inlined like user code."""
    def handler(state, *args, **kwargs):
        return function_value(state, POLYFILLS[fn]).call(state, list(args), kwargs)

    return handler


for _original in POLYFILLS:
    HANDLERS[_original] = _polyfilled(_original)


@handles(itertools.chain)
def _chain(state, *iterables):
    return ChainValue(state, list(iterables))


@handles(itertools.product)
def _product(state, *iterables, repeat=None):
    columns = [it.unpack(state) for it in iterables] * (repeat.as_constant() if repeat is not None else 1)
    rows = [TupleValue(list(row)) for row in _replayed(itertools.product, *columns)]
    return IteratorValue(rows, itertools.product, _rebuilt_call(itertools.product, *map(TupleValue, columns)))


@handles(itertools.combinations)
def _combinations(state, iterable, r):
    """Consumes its input up front, as eager does; the combinations are of positions in it."""
    pool = iterator_of(state, iterable).unpack(state)
    picks = _replayed(itertools.combinations, range(len(pool)), r.as_constant())
    rows = [TupleValue([pool[i] for i in pick]) for pick in picks]
    return IteratorValue(rows, itertools.combinations, _rebuilt_call(itertools.combinations, TupleValue(pool), r))


def _replayed(fn: Callable, *args):
    """`list(fn(*args))` on real values, raising eager's own exception (a negative `r`) as traced code's."""
    try:
        return list(fn(*args))
    except Exception as e:
        raise python_error(e, fn.__name__) from e


def _rebuilt_call(fn: Callable, *args: Value) -> Callable:
    """The `fresh` of an iterator that `fn(*args)` makes (see IteratorValue): the call, written again."""
    return lambda writer: f"{writer.constant(fn)}({', '.join(writer.value(a) for a in args)})"


@handles(itertools.permutations)
def _permutations(state, iterable, r=None):
    pool = iterator_of(state, iterable).unpack(state)
    picks = _replayed(itertools.permutations, range(len(pool)), r.as_constant() if r is not None else None)
    rows = [TupleValue([pool[i] for i in pick]) for pick in picks]
    return IteratorValue(rows, itertools.permutations,
                         _rebuilt_call(itertools.permutations, TupleValue(pool), r or ConstantValue(None)))


@handles(itertools.count)
def _count(state, start=None, step=None):
    return CountValue(state, start.as_constant() if start is not None else 0,
                      step.as_constant() if step is not None else 1)


@handles(itertools.repeat)
def _repeat(state, item, times=None):
    return RepeatValue(state, item, max(times.as_constant(), 0) if times is not None else None)


@handles(itertools.takewhile)
def _takewhile(state, predicate, iterable):
    return WhileValue(state, predicate, iterator_of(state, iterable), taking=True)


@handles(itertools.dropwhile)
def _dropwhile(state, predicate, iterable):
    return WhileValue(state, predicate, iterator_of(state, iterable), taking=False)


@handles(itertools.pairwise)
def _pairwise(state, iterable):
    return PairwiseValue(state, iterator_of(state, iterable))


@handles(itertools.islice)
def _islice(state, iterable, *bounds):
    values = [b.as_constant() for b in bounds]
    if (any(v is not None and (not isinstance(v, int) or v < 0) for v in values)
            or (len(values) == 3 and values[2] == 0)):
        raise raise_python(ValueError, "Indices for islice() must be None or an integer: 0 <= x <= sys.maxsize.")
    return IsliceValue(state, iterator_of(state, iterable), slice(*values))


@handles(functools.reduce)
def _reduce(state, fn, iterable, *initial):
    """`functools.reduce` unrolled: `fn` is traced (or folded) once per item."""
    items = list(initial) + iterable.unpack(state)
    if not items:
        raise GraphBreak("exception", "reduce() of empty iterable with no initial value")
    total = items[0]
    for item in items[1:]:
        total = fn.call(state, [total, item], {})
    return total


@handles(builtins.map)
def _map(state, fn, *iterables):
    return MapValue(state, fn, [iterator_of(state, it) for it in iterables])


@handles(builtins.filter)
def _filter(state, fn, iterable):
    return FilterValue(state, fn, iterator_of(state, iterable))


@handles(builtins.list)
def _list(state, iterable=None):
    return ListValue(iterable.unpack(state) if iterable is not None else [])


@handles(builtins.tuple)
def _tuple(state, iterable=None):
    if iterable is not None and _is_exactly(iterable, tuple):
        return iterable  # tuple(t) of an exact tuple is t itself
    return TupleValue(iterable.unpack(state) if iterable is not None else [])


def _is_exactly(value: Value, cls: type) -> bool:
    value = value.realize()
    if isinstance(value, TupleValue) or value.is_constant():
        return value.python_type() is cls
    return False


@handles(builtins.locals)
def _locals(state):
    """`locals()`: the calling frame's bound variables, cells and free variables included, in CPython's order.

    Run natively after a break, it would read the output program's own frame (eval("x < y", locals()) then
    misses x); here it is the traced frame's, a new dict as Python 3.13 makes (3.11 and 3.12 hand out one dict
    per frame, refreshed per call)."""
    frame = state.frames[-1]
    code = frame.code
    names = code.co_varnames + tuple(c for c in code.co_cellvars if c not in code.co_varnames) + code.co_freevars
    bound = {}
    for name in names:
        if name in frame.locals:
            bound[name] = frame.locals[name]
        elif name in frame.cells and not _is_empty(state, frame.cells[name]):
            bound[name] = frame.cells[name].load(state)
    return DictValue(bound)


@handles(builtins.set)
def _set(state, iterable=None):
    made = SetValue([])
    if iterable is not None:
        made.update_from(state, iterable)  # a set or dict merged at once, as set() does
    return made


@handles(builtins.frozenset)
def _frozenset(state, iterable=None):
    """Immutable, so a constant: hashing needs its items to be constants too."""
    if iterable is not None and _is_exactly(iterable, frozenset):
        return iterable  # frozenset(fs) of an exact frozenset is fs itself
    items = [v.as_constant() for v in (iterable.unpack(state) if iterable is not None else [])]
    source = iterable.realize() if iterable is not None else None
    if isinstance(source, SetValue) and source.is_constant():
        items = source.keys  # merged from the set itself, as eager's frozenset(s): the same order
    elif isinstance(source, DictValue):
        items = dict.fromkeys(items)  # merged as a dict, as eager's frozenset(d)
    try:
        return ConstantValue(frozenset(items))
    except TypeError as e:  # an unhashable item: eager's TypeError
        raise python_error(e, "frozenset") from e


@handles(builtins.dict)
def _dict(state, pairs=None, **kwargs):
    items = dict(update_pairs(state, pairs)) if pairs is not None else {}
    items.update(kwargs)
    return DictValue(items)


@handles(collections.deque)
def _deque(state, iterable=None, maxlen=None):
    items = iterator_of(state, iterable).unpack(state) if iterable is not None else []
    return DequeValue(items, maxlen.as_constant() if maxlen is not None else None)


@handles(collections.OrderedDict)
def _ordered_dict(state, pairs=None, **kwargs):
    value = _dict(state, pairs, **kwargs)
    value.cls = collections.OrderedDict
    return value


@handles(collections.defaultdict)
def _defaultdict(state, default_factory=None, pairs=None, **kwargs):
    value = _dict(state, pairs, **kwargs)
    factory = default_factory.realize() if default_factory is not None else None
    if factory is not None and not (factory.is_constant() and factory.as_constant() is None):
        if not _callable(state, factory).as_constant():
            raise raise_python(TypeError, "first argument must be callable or None")
    value.cls, value.default_factory = collections.defaultdict, factory
    return value


def _fromkeys(cls: type):
    def handler(state, keys, value=None):
        return fromkeys(state, cls, keys, value)

    return handler


for _dict_cls in (dict, collections.OrderedDict, collections.defaultdict):
    HANDLERS[_dict_cls.fromkeys] = _fromkeys(_dict_cls)


@handles(builtins.slice)
def _slice(state, *args):
    parts = list(args) if len(args) > 1 else [ConstantValue(None), args[0]]
    while len(parts) < 3:
        parts.append(ConstantValue(None))
    return SliceValue(*parts)


@handles(builtins.sorted)
def _sorted(state, iterable, key=None, reverse=None):
    items = list(iterable.unpack(state))
    return ListValue([items[i] for i in sort_order(state, items, key, reverse)])


def _all(state, iterable):
    return ConstantValue(all(v.truth(state) for v in _each(state, iterable)))


def _any(state, iterable):
    return ConstantValue(any(v.truth(state) for v in _each(state, iterable)))


def _each(state, iterable):
    """The items of `iterable` one at a time, so a consumer that stops early (any, all) takes no more."""
    iterator = iterator_of(state, iterable)
    while (value := iterator.next()) is not None:
        yield value


HANDLERS[builtins.all], HANDLERS[builtins.any] = _all, _any


@handles(builtins.sum)
def _sum(state, iterable, start=None):
    total = start if start is not None else ConstantValue(0)
    for item in iterable.unpack(state):
        total = apply_operator(state, operator.add, [total, item])
    return total


def _extreme(pick: Callable):
    """`min`/`max`: the first item whose key is smallest/largest, as Python picks it. 0-d tensors of one dtype
    (no key) are compared in the graph: `torch.where(item > best, item, best)` folded left is Python's choice,
    value and gradient alike (torch.compile uses torch.maximum, which splits the gradient of ties)."""
    replaces = operator.gt if pick is max else operator.lt
    symbolic_pick = torch.sym_max if pick is max else torch.sym_min

    def handler(state, *args, key=None, default=None):
        items = list(args[0].unpack(state)) if len(args) == 1 else list(args)
        if not items:
            if default is not None:
                return default
            raise raise_python(ValueError, f"{pick.__name__}() arg is an empty sequence")
        if key is None and _symbolic_ints(items):
            best = items[0]
            for item in items[1:]:  # torch.sym_max / sym_min: the symbol stays (the ints are equal where tied)
                best = trace_op(state, "call_function", symbolic_pick, [best, item], {})
            return best
        if key is None and _same_kind_scalars(items):
            best = items[0]
            for item in items[1:]:
                better = apply_operator(state, replaces, [item, best])
                best = trace_op(state, "call_function", torch.where, [better, item, best], {})
            return best
        keys = sort_keys(state, items, key)
        try:
            return items[pick(range(len(keys)), key=keys.__getitem__)]
        except TypeError as e:
            raise raise_python(TypeError, str(e)) from None

    return handler


def _symbolic_ints(items: list[Value]) -> bool:
    """Ints, one of them symbolic (an int input made a symbol, a dynamic size): `min(n, limit)` keeps it."""
    values = [i.realize() for i in items]
    return any(isinstance(v, SymValue) for v in values) and all(
        v.python_type() is int and (isinstance(v, SymValue) or v.is_constant()) for v in values)


def _same_kind_scalars(items: list[Value]) -> bool:
    """All 0-d tensors of one dtype and device: picking one is a pointwise choice between them."""
    tensors = [i.realize() for i in items]
    if not all(isinstance(t, TensorValue) for t in tensors):
        return False
    fakes = [t.fake for t in tensors]
    return all(f.dim() == 0 and f.dtype == fakes[0].dtype and f.device == fakes[0].device for f in fakes)


HANDLERS[builtins.min], HANDLERS[builtins.max] = _extreme(min), _extreme(max)


@handles(builtins.abs)
def _abs(state, x):
    return apply_operator(state, operator.abs, [x])


def _scalar_cast(cls):
    def handler(state, x=None, *rest):
        if x is None:
            return ConstantValue(cls())

        if isinstance(x.realize(), TensorValue):
            if cls is bool and not rest:
                return ConstantValue(x.realize().truth(state))  # a break unless the value is known
            raise GraphBreak("tensor_to_python", f"{cls.__name__}() of a tensor")
        if isinstance(x.realize(), SymValue) and cls in _SYMBOLIC_CASTS and not rest:
            return _symbolic_cast(state, cls, x.realize())
        if cls is bool:
            return ConstantValue(x.truth(state))
        return _fold(cls, [x, *rest], {})

    return handler


def _math(fn: Callable):
    """`fn` (a `math` function, `round`) symbolic on a symbolic number (values/symbolic_math.py), else folded."""
    def handler(state, *args, **kwargs):
        result = None if kwargs else symbolic_math(state, fn, [a.realize() for a in args])
        return result if result is not None else _fold(fn, list(args), kwargs)

    return handler


for _fn in SYMBOLIC_MATH:
    HANDLERS[_fn] = _math(_fn)


# float(n) and int(n) of a symbolic size stay symbolic (graph nodes), as torch's sym_float / sym_int
_SYMBOLIC_CASTS = {float: torch.sym_float, int: torch.sym_int}


def _symbolic_cast(state, cls: type, x: SymValue) -> Value:
    if x.python_type() is cls:
        return x
    return trace_op(state, "call_function", _SYMBOLIC_CASTS[cls], [x], {})


for _cls in (int, float, bool, str):
    HANDLERS[_cls] = _scalar_cast(_cls)


@handles(builtins.id)
def _id(state, obj):
    value = obj.realize()
    real = getattr(value, "obj", None)
    if real is None:
        raise GraphBreak("unsupported_call", "id() of a value made during capture")
    if value.source is not None:  # the folded id holds only for this very object: guard its identity

        state.guard_identity(real, value.source)
    return ConstantValue(id(real))


@handles(functools.partial)
def _partial(state, fn, *args, **kwargs):
    return PartialValue(fn, list(args), kwargs)


@handles(functools.wraps)
def _wraps(state, wrapped, assigned=None, updated=None):
    """`functools.wraps(f, ...)`: a partial of `update_wrapper`, as functools makes it."""
    options = {k: v for k, v in (("assigned", assigned), ("updated", updated)) if v is not None}
    return PartialValue(BuiltinValue(functools.update_wrapper), [], {"wrapped": wrapped, **options})


@handles(functools.update_wrapper)
def _update_wrapper(state, wrapper, wrapped, assigned=None, updated=None):
    assigned = functools.WRAPPER_ASSIGNMENTS if assigned is None else assigned.as_constant()
    updated = functools.WRAPPER_UPDATES if updated is None else updated.as_constant()
    return update_wrapper(state, wrapper, wrapped, assigned, updated)


@handles(torch._C._group_tensors_by_device_and_dtype)
def _group_by_device_and_dtype(state, lists: Value, with_indices: Value | None = None) -> Value:
    """`{(device, dtype): ([tensors of each list at those positions], positions)}`, keyed by the first
    list's tensors. Devices and dtypes are known at capture, so the grouping is structure, not a graph op
    (foreach users such as clip_grad_norm_ call it)."""
    rows = [row.realize().items for row in lists.realize().items]
    groups: dict = {}
    for i, t in enumerate(rows[0]):
        fake = t.realize().fake
        groups.setdefault((fake.device, fake.dtype), []).append(i)
    return DictValue({key: TupleValue([ListValue([ListValue([row[i] for i in where]) for row in rows]),
                                       ListValue([ConstantValue(i) for i in where])])
                      for key, where in groups.items()})


@handles(builtins.super)
def _super(state, *args):
    if args:
        return SuperValue(args[0].as_constant(), args[1])
    cls, self_value = state.current_frame().zero_arg_super()
    return SuperValue(cls, self_value)


@handles(torch._assert, getattr(torch, "_assert_async", torch._assert))
def _torch_assert(state, condition, message=None):
    if condition.realize().is_constant():
        if not condition.as_constant():
            raise GraphBreak("exception", f"assertion failed: {message.as_constant() if message else ''}")
        return ConstantValue(None)
    raise GraphBreak("data_dependent_branch", "torch._assert on a tensor")



HANDLERS.update(copies.HANDLERS)  # copy.copy and copy.deepcopy
