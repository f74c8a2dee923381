"""Pure-Python versions of C helpers from `itertools` and `operator`, and of torch functions capture cannot
step into (`associative_scan`) or whose checks tracing drops (`one_hot`), which capture inlines like user code.

kiln cannot step into a C function, and modelling each one as a tracker is a class per helper; these are
the equivalents CPython's documentation gives, so the traced behaviour is Python's own: lazy where the
original is lazy (each is a generator), item by item, calling user functions (a key, a reducer) as the
original does. `POLYFILLS` maps the C callable to its stand-in; `values.builtins` inlines the stand-in
when traced code calls the original.
"""
from __future__ import annotations

import itertools
import operator

import torch
from torch._higher_order_ops.associative_scan import associative_scan as torch_associative_scan


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


def associative_scan(combine_fn, xs, dim, reverse=False, combine_mode="pointwise"):
    """torch's `associative_scan` as the scan it computes: element i of the result is `combine_fn` folded
    over elements 0..i (i..n-1 when `reverse`) along `dim`, each element a slice without `dim`.

    Eager runs it (combine_mode="generic") as a tree of `torch.vmap`ped calls, which capture cannot step
    into; torch.compile traces it as one graph (Mamba's selective scan). This is the same fold, one
    `combine_fn` call per element in order: the tree regroups the calls, which `combine_fn` being
    associative (the function's contract) makes the same result, up to the rounding of the regrouping.
    """
    leaves = _scan_leaves(xs)
    _check_scan_inputs(combine_fn, leaves, dim, reverse, combine_mode)
    length = leaves[0].shape[dim]
    results = [None] * length
    carry = None
    for i in (range(length - 1, -1, -1) if reverse else range(length)):
        element = _scan_tree(xs, iter([leaf.select(dim, i) for leaf in leaves]))
        carry = element if carry is None else combine_fn(carry, element)
        results[i] = _scan_leaves(carry)
    dim = dim % leaves[0].ndim
    return _scan_tree(xs, iter([torch.stack([r[k] for r in results], dim) for k in range(len(leaves))]))


def _scan_leaves(tree):
    """The tensors of a tuple, list or dict tree, in pytree's order."""
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _scan_leaves(item)]
    if isinstance(tree, dict):
        return [leaf for key in tree for leaf in _scan_leaves(tree[key])]
    return [tree]


def _scan_tree(like, leaves):
    """`like`'s tree structure (a namedtuple too) holding the next tensors of the iterator `leaves`."""
    if isinstance(like, (tuple, list)):
        items = [_scan_tree(item, leaves) for item in like]
        return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)
    if isinstance(like, dict):
        return {key: _scan_tree(like[key], leaves) for key in like}
    return next(leaves)


def _check_scan_inputs(combine_fn, leaves, dim, reverse, combine_mode):
    """The errors eager's `associative_scan` raises for its arguments, in its order."""
    if not callable(combine_fn):
        raise ValueError(f"Combine_fn must be a callable, but got {combine_fn}")
    if not isinstance(dim, int):
        raise ValueError("Dim must be an int, but got " + str(type(dim)))
    if not isinstance(reverse, bool):
        raise RuntimeError("Reverse must be a bool, but got " + str(type(reverse)))
    if combine_mode not in ("pointwise", "generic"):
        raise ValueError(f"Combine_mode must either 'pointwise' or 'generic', but got {combine_mode}")
    if combine_mode == "pointwise" and not all(leaf.device.type in ("cuda", "xpu") for leaf in leaves):
        raise ValueError("For combine_mode='pointwise', all input tensors need to be on CUDA or XPU")
    if not leaves:
        raise ValueError("Expected at least 1 xs leaf")
    if not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        raise ValueError("xs leaves must be a Tensor")
    if any(leaf.ndim <= dim or leaf.shape[dim] == 0 for leaf in leaves):
        raise ValueError("All xs leaves must at least have 'dim' number of dimensions and scan dimension > 0")


def one_hot(tensor, num_classes=-1):
    """`F.one_hot` with the check of its class values that eager makes and tracing drops (fake tensors skip it, and
    the traced graph compares with an arange, giving a row of zeros for a class out of range): such a value makes
    the graph raise, and the frame's eager re-run (capture/rerun.py) raises eager's RuntimeError. CPU only: on a
    GPU the graph-side check is a device assert, fatal to the process. `num_classes=-1` reads the values for the
    size, and capture breaks the graph there before this matters."""
    if num_classes >= 0 and tensor.dtype == torch.int64 and tensor.device.type == "cpu":
        # the ATen op, traced into the graph (`torch._assert_async` itself breaks it, as an `assert` on a value may)
        torch.ops.aten._assert_async.msg(((tensor >= 0) & (tensor < num_classes)).all(),
                                         "one_hot: a class value out of range")
    return torch.ops.aten.one_hot.default(tensor, num_classes)


POLYFILLS = {
    torch.nn.functional.one_hot: one_hot,
    torch_associative_scan: associative_scan,
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
