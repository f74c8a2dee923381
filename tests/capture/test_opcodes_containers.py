"""Tuples, lists, dicts, sets; comprehensions; unpacking (starred too); container methods.

All of these are Python-level and fold at capture time: one graph each.
"""
import collections

import pytest
import torch

from support.capture import check, t


def build_tuple_list(x):
    a = (x, x + 1)
    b = [a[0] * 2, a[1]]
    return a, b


def list_methods(x):
    xs = [x]
    xs.append(x + 1)
    xs.extend([x * 2, x * 3])
    xs.insert(0, x - 1)
    last = xs.pop()
    xs.reverse()
    return xs, last


def list_index_count(x):
    xs = [1, 2, 3, 2]
    return x * xs.index(3) + xs.count(2)


def list_slicing(x):
    xs = [x, x + 1, x + 2, x + 3, x + 4]
    return xs[1:3], xs[::-2], xs[-1]


def list_setitem_delitem(x):
    xs = [x, x, x]
    xs[1] = x * 5
    del xs[0]
    xs[0:1] = [x * 7]
    return xs


def list_concat_repeat(x):
    a = [x] + [x * 2]
    b = [0] * 3
    return a, b, (x, 1) + (2,)


def dict_ops(x):
    d = {"a": x, "b": x * 2}
    d["c"] = d["a"] + d["b"]
    d.update({"e": x - 1})
    e = d.pop("e")
    return d, e, d.get("missing", 3), "a" in d, len(d)


def dict_iteration(x):
    d = {"p": x, "q": x * 2, "r": x * 3}
    total = 0
    for _k, v in d.items():
        total = total + v
    keys = list(d.keys())
    vals = sum(d.values())
    return total, keys, vals


def dict_setdefault_copy(x):
    d = {}
    d.setdefault("k", x)
    d.setdefault("k", x * 100)
    c = dict(d)
    c["z"] = x
    return d, c


def dict_kwargs_constructor(x):
    d = dict(a=x, b=2)
    return d["a"] * d["b"]


def dict_int_keys(x):
    d = {0: x, 1: x + 1}
    return d[0] * d[1]


def dict_comprehension(x):
    d = {f"k{i}": x * i for i in range(3)}
    return d


def list_comprehension(x):
    return [x * i for i in range(4) if i != 2]


def nested_comprehension(x):
    return [[x + i + j for j in range(2)] for i in range(2)]


def set_comprehension(x):
    s = {i % 3 for i in range(10)}
    return x * len(s)


def set_ops(x):
    s = {1, 2}
    s.add(3)
    s2 = s | {4}
    s3 = s & {2, 3, 9}
    return x * len(s2) + len(s3), 3 in s


def unpack_tuple(x):
    a, b = x, x * 2
    (c, d), e = (a + 1, b + 1), 3
    return a + b + c + d + e


def unpack_starred(x):
    first, *middle, last = [x, x * 2, x * 3, x * 4]
    return first, middle, last


def unpack_starred_head(x):
    *head, tail = (1, 2, 3)
    return x * tail + sum(head)


def unpack_tensor_chunks(x):
    a, b = x.chunk(2)
    return a * b


def unpack_shape(x):
    n, c, h = x.shape
    return x.view(n, c * h)


def star_call(x):
    args = [x, 1]
    return torch.sum(*args)


def build_list_unpack(x):
    xs = [x, x]
    return [*xs, x * 3], (*xs, 1)


def build_map_unpack(x):
    a = {"a": x}
    b = {**a, "b": x * 2}
    return b


def tuple_compare(x):
    if x.shape == (2, 3):
        return x * 2
    return x * 3


def tuple_index_count(x):
    tup = (4, 5, 6, 5)
    return x * tup.index(6) + tup.count(5)


def sorted_reversed(x):
    order = sorted([3, 1, 2])
    rev = list(reversed(order))
    return x * order[0] + rev[0]


def enumerate_zip(xs, ys):
    out = []
    for i, (a, b) in enumerate(zip(xs, ys)):
        out.append(a * b + i)
    return out


def enumerate_start(xs):
    return [x * i for i, x in enumerate(xs, start=1)]


def zip_three(x):
    out = 0
    for a, b, c in zip(range(3), [1, 2, 3], (x, x, x)):
        out = out + a * b * c
    return out


def map_filter(x):
    evens = list(filter(lambda i: i % 2 == 0, range(6)))
    sq = list(map(lambda i: i * i, evens))
    return x * sum(sq)


def any_all(x):
    flags = [True, False]
    return x * int(any(flags)) + int(all(flags))


Point = collections.namedtuple("Point", ["a", "b"])


def namedtuple_make(x):
    p = Point(x, b=x * 2)
    return p.a + p.b, p[0]


def list_of_tensors_stack(x):
    parts = [x[i] * i for i in range(x.shape[0])]
    return torch.stack(parts), torch.cat(parts)


def len_of_containers(x):
    return x * (len([1, 2]) + len((1,)) + len({"a": 1}) + len("abc") + len(x))


def return_dict_of_lists(x):
    return {"outs": [x, x * 2], "n": 2}


def iter_next(x):
    it = iter([x, x * 2, x * 3])
    a = next(it)
    b = next(it)
    return a + b + next(it, 0)


def list_in_tuple_contains(x):
    xs = [x]
    return x * (1 if x in xs else 2)


def slice_object(x):
    s = slice(1, None)
    return x[s], [1, 2, 3][s]


def dict_keys_order_after_delete(x):
    d = {"a": x, "b": x * 2, "c": x * 3}
    del d["b"]
    d["b"] = x * 4
    return list(d), d["b"]


def list_sort_inplace(x):
    xs = [3, 1, 2]
    xs.sort()
    return x * xs[0], xs


def min_max_on_constants(x):
    return x * min(3, 1, 2) + max([4, 5]) + min((7, 8))


def list_mutation_alias(x):
    a = [x]
    b = a
    b.append(x * 2)
    return a


CASES = [
    (build_tuple_list, (t(3, grad=True),)),
    (list_methods, (t(3),)),
    (list_index_count, (t(3),)),
    (list_slicing, (t(3),)),
    (list_setitem_delitem, (t(3),)),
    (list_concat_repeat, (t(3),)),
    (dict_ops, (t(3),)),
    (dict_iteration, (t(3, grad=True),)),
    (dict_setdefault_copy, (t(3),)),
    (dict_kwargs_constructor, (t(3),)),
    (dict_int_keys, (t(3),)),
    (dict_comprehension, (t(3),)),
    (list_comprehension, (t(3, grad=True),)),
    (nested_comprehension, (t(3),)),
    (set_comprehension, (t(3),)),
    (set_ops, (t(3),)),
    (unpack_tuple, (t(3, grad=True),)),
    (unpack_starred, (t(3),)),
    (unpack_starred_head, (t(3),)),
    (unpack_tensor_chunks, (t(4, 3, grad=True),)),
    (unpack_shape, (t(2, 3, 4),)),
    (star_call, (t(3, 4),)),
    (build_list_unpack, (t(3),)),
    (build_map_unpack, (t(3),)),
    (tuple_compare, (t(2, 3),)),
    (tuple_compare, (t(3, 2),)),
    (tuple_index_count, (t(3),)),
    (sorted_reversed, (t(3),)),
    (enumerate_zip, ([t(2), t(2)], [t(2), t(2)])),
    (enumerate_start, ([t(2), t(2), t(2)],)),
    (zip_three, (t(3),)),
    (map_filter, (t(3),)),
    (any_all, (t(3),)),
    (namedtuple_make, (t(3),)),
    (list_of_tensors_stack, (t(3, 2, grad=True),)),
    (len_of_containers, (t(4),)),
    (return_dict_of_lists, (t(3),)),
    (iter_next, (t(3),)),
    (list_in_tuple_contains, (t(3),)),
    (slice_object, (t(4),)),
    (dict_keys_order_after_delete, (t(3),)),
    (list_sort_inplace, (t(3),)),
    (min_max_on_constants, (t(3),)),
    (list_mutation_alias, (t(3),)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_containers_one_graph(fn, args):
    check(fn, *args, graphs=1, records=1, fullgraph=True)


def list_arg_mutated(xs, x):
    xs.append(x * 2)
    xs[0] = x + 1
    return len(xs)


def dict_arg_mutated(d, x):
    d["new"] = x * 2
    d.pop("old")
    return d["keep"] + 1


def test_list_argument_mutation_visible_to_caller():
    x = t(3)
    eager_list, compiled_list = [x], [x]
    import kiln

    fn = kiln.compile(list_arg_mutated, backend="eager", fullgraph=True)
    assert fn(compiled_list, x) == list_arg_mutated(eager_list, x)
    assert len(compiled_list) == len(eager_list) == 2
    torch.testing.assert_close(compiled_list[0], eager_list[0])
    torch.testing.assert_close(compiled_list[1], eager_list[1])


def test_dict_argument_mutation_visible_to_caller():
    import kiln

    x = t(3)
    e = {"keep": x, "old": 1}
    c = {"keep": x, "old": 1}
    fn = kiln.compile(dict_arg_mutated, backend="eager", fullgraph=True)
    torch.testing.assert_close(fn(c, x), dict_arg_mutated(e, x))
    assert list(c) == list(e) == ["keep", "new"]
    torch.testing.assert_close(c["new"], e["new"])


def itertools_and_reduce(xs):
    import functools
    import itertools
    import operator

    chained = list(itertools.chain(xs, [xs[0] * 2]))
    pairs = [a * b for a, b in itertools.product(xs[:2], repeat=2)]
    head = list(itertools.islice(xs, 2))
    total = functools.reduce(operator.add, chained)
    prod = functools.reduce(lambda a, b: a * b, xs, 1.0)
    return total, pairs, head, prod


def zip_star_transpose(x):
    rows = [(x, x * 2), (x * 3, x * 4)]
    firsts, seconds = zip(*rows)
    return list(firsts), seconds


def reversed_enumerate_modules_free(xs):
    out = []
    for i, v in enumerate(reversed(xs)):
        out.append(v * i)
    return out


def shape_conversions(x):
    return x * 1, list(x.shape), tuple(x.size()), x.shape == torch.Size([2, 3]), str(x.shape), repr(x.dtype)


@pytest.mark.parametrize("fn,args", [
    (itertools_and_reduce, ([t(2, grad=True), t(2), t(2)],)),
    (zip_star_transpose, (t(3),)),
    (reversed_enumerate_modules_free, ([t(2), t(2), t(2)],)),
    (shape_conversions, (t(2, 3),)),
], ids=lambda v: getattr(v, "__name__", ""))
def test_iteration_helpers_one_graph(fn, args):
    check(fn, *args, graphs=1, records=1, fullgraph=True)
