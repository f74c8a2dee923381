"""Pure-Python versions of C helpers from `itertools` and `operator`, which capture inlines like user code.

kiln cannot step into a C function, and modelling each one as a tracker is a class per helper; these are
the equivalents CPython's documentation gives, so the traced behaviour is Python's own: lazy where the
original is lazy (each is a generator), item by item, calling user functions (a key, a reducer) as the
original does. `POLYFILLS` maps the C callable to its stand-in; `values.builtins` inlines the stand-in
when traced code calls the original.
"""
from __future__ import annotations

import itertools
import operator


def accumulate(iterable, func=None, *, initial=None):
    iterator = iter(iterable)
    total = initial
    if initial is None:
        try:
            total = next(iterator)
        except StopIteration:
            return
    yield total
    for element in iterator:
        total = total + element if func is None else func(total, element)
        yield total


def zip_longest(*iterables, fillvalue=None):
    iterators = [iter(it) for it in iterables]
    active = len(iterators)
    if not active:
        return
    while True:
        values = []
        for i, it in enumerate(iterators):
            try:
                value = next(it)
            except StopIteration:
                active -= 1
                if not active:
                    return
                iterators[i] = itertools.repeat(fillvalue)
                value = fillvalue
            values.append(value)
        yield tuple(values)


def groupby(iterable, key=None):
    """Groups share the one iterator: advancing to the next key skips the rest of the current group."""
    keyfunc = (lambda x: x) if key is None else key
    iterator = iter(iterable)
    exhausted = False

    def grouper(target_key):
        nonlocal current_value, current_key, exhausted
        yield current_value
        for current_value in iterator:
            current_key = keyfunc(current_value)
            if current_key != target_key:
                return
            yield current_value
        exhausted = True

    try:
        current_value = next(iterator)
    except StopIteration:
        return
    current_key = keyfunc(current_value)
    while not exhausted:
        target_key = current_key
        group = grouper(target_key)
        yield current_key, group
        if current_key == target_key:
            for _ in group:
                pass


def chain_from_iterable(iterables):
    for iterable in iterables:
        yield from iterable


def batched(iterable, n):
    if n < 1:
        raise ValueError("n must be at least one")
    iterator = iter(iterable)
    while batch := tuple(itertools.islice(iterator, n)):
        yield batch


def itemgetter(item, *items):
    if not items:
        def get_item(obj):
            return obj[item]
        return get_item
    keys = (item, *items)

    def get_items(obj):
        return tuple(obj[k] for k in keys)
    return get_items


def attrgetter(attr, *attrs):
    def resolve(obj, dotted):
        for name in dotted.split("."):
            obj = getattr(obj, name)
        return obj

    if not attrs:
        def get_attr(obj):
            return resolve(obj, attr)
        return get_attr
    names = (attr, *attrs)

    def get_attrs(obj):
        return tuple(resolve(obj, name) for name in names)
    return get_attrs


def methodcaller(name, /, *args, **kwargs):
    def call_method(obj):
        return getattr(obj, name)(*args, **kwargs)
    return call_method


POLYFILLS = {
    itertools.accumulate: accumulate,
    itertools.zip_longest: zip_longest,
    itertools.groupby: groupby,
    itertools.chain.from_iterable: chain_from_iterable,
    operator.itemgetter: itemgetter,
    operator.attrgetter: attrgetter,
    operator.methodcaller: methodcaller,
}
if hasattr(itertools, "batched"):  # Python 3.12
    POLYFILLS[itertools.batched] = batched
