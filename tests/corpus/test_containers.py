"""Python containers and loops inside compiled code, as Dynamo's test_functions.py and test_misc exercise them:
lists, tuples, dicts (and their views), OrderedDict, defaultdict, deque, sets, namedtuples, dataclasses, enums,
comprehensions, loops and itertools."""
import collections
import enum
import itertools
import operator
from dataclasses import dataclass

import pytest
import torch

from .reference import Table, check, t

torch.manual_seed(0)
cases = Table()
A, B = t(4), t(4)


class Point(collections.namedtuple("Point", "x y")):
    pass


Pair = collections.namedtuple("Pair", ["first", "second"])


@dataclass
class Box:
    value: torch.Tensor
    scale: float = 1.0


class Color(enum.Enum):
    RED = 1
    GREEN = 2

# --- containers ---------------------------------------------------------------------------------------------------


@cases((A, B))
def tuple_return(a, b):
    return a - b, b - a, a, b


@cases((A, B))
def list_return(a, b):
    return [a + b, a * b]


@cases((A, B))
def dict_return(a, b):
    return {"sum": a + b, "diff": a - b}


@cases((A,))
def nested_container_return(a):
    return {"x": [a, (a + 1, {"y": a * 2})], "n": 3}


@cases((A, B))
def list_ops(a, b):
    xs = [a]
    xs.append(b)
    xs.extend([a * 2, b * 2])
    xs.insert(1, a + b)
    last = xs.pop()
    return xs, last, len(xs)


@cases((A, B))
def list_slicing_and_reverse(a, b):
    xs = [a, b, a + b, a - b]
    xs.reverse()
    return xs[1:3], xs[::-1], xs[-1]


@cases((A, B))
def list_item_assignment(a, b):
    xs = [a, b, a]
    xs[1] = a * b
    xs[0:2] = [b, b]
    del xs[2]
    return xs


@cases((A,))
def list_index_count(a):
    xs = [3, 1, 3, 2]
    return a * xs.index(1) + xs.count(3)


@cases((A,))
def list_sort_constants(a):
    xs = [3, 1, 2]
    xs.sort()
    return a * xs[0] + xs[-1]


@cases((A, B))
def list_concat_repeat(a, b):
    xs = [a] + [b]
    ys = [1] * 3
    return xs * 2, a * len(ys)


@cases((A, B))
def list_membership_on_constants(a, b):
    return a + (2 in [1, 2, 3]) + (5 not in (1, 2))


@cases((A, B))
def tuple_unpack_star(a, b):
    first, *rest = (a, b, a + b)
    return first, rest


@cases((A, B))
def tuple_compare(a, b):
    total = a
    for x, y in [((1, 2, 3), (1, 2, 3)), ((1, 4), (1, 2)), ((1, 2), (1, 2, 3))]:
        total = total + (x == y) * 1 + (x < y) * 2 + (x > y) * 4 + (x != y) * 8
    return total


@cases((A, B))
def dict_ops(a, b):
    d = {"a": a}
    d["b"] = b
    d.update({"c": a + b})
    d.update(d2=b * 2)
    popped = d.pop("a")
    return d, popped, len(d), "b" in d


@cases((A,))
def dict_get_and_setdefault(a):
    d = {"a": 1, "b": 2}
    d.setdefault("a", 10)
    d.setdefault("c", 5)
    return a * d["a"] + d["c"] + d.get("zz", 7)


@cases((A, B))
def dict_iteration_orders(a, b):
    d = {"b": b, "a": a}
    keys = list(d.keys())
    vals = list(d.values())
    items = [k + "!" for k, _ in d.items()]
    return keys, vals, items


@cases((A,))
def dict_keys_view_membership(a):
    d = {3: a}
    keys = d.keys()
    d[4] = a + 1
    return 3 in keys, 4 in keys, 5 in keys, len(keys)


@cases((A,))
def dict_values_view_live(a):
    d = {3: a}
    values = d.values()
    d[4] = a + 2
    return len(values)


@cases((A, B))
def dict_comprehension(a, b):
    return {name: t * 2 for name, t in (("a", a), ("b", b))}


@cases((A, B))
def dict_constructor_kwargs(a, b):
    return dict(first=a + 1, second=b + 2)


@cases((A, B))
def dict_from_pairs_and_copy(a, b):
    d = dict([("x", a), ("y", b)])
    e = d.copy()
    e["x"] = a * 10
    return d, e


@cases((A,))
def dict_delete_and_clear(a):
    d = {"x": a, "y": a + 1, "z": a + 2}
    del d["y"]
    keys = list(d)
    d.clear()
    return keys, len(d)


@cases((A, B))
def dict_merge_operator(a, b):
    d = {"a": a} | {"b": b}
    d |= {"c": a * b}
    return d


@cases((A, B))
def ordered_dict_basic(a, b):
    d = collections.OrderedDict()
    d["b"] = b
    d["a"] = a
    return list(d.items())


@cases((A, B))
def ordered_dict_move_to_end(a, b):
    d = collections.OrderedDict(x=a, y=b, z=a + b)
    d.move_to_end("x")
    return list(d.keys()), list(d.values())


@cases((A,))
def defaultdict_list(a):
    d = collections.defaultdict(list)
    d["k"].append(a)
    d["k"].append(a * 2)
    return len(d["k"]), d["k"][1], d.default_factory is list


@cases((A,))
def defaultdict_int_counts(a):
    d = collections.defaultdict(int)
    for word in ["x", "y", "x"]:
        d[word] += 1
    return a * d["x"] + d["y"] + d["missing"]


@cases((A, B))
def deque_ops(a, b):
    q = collections.deque([a, b])
    q.append(a + 1)
    q.appendleft(b + 1)
    last = q.pop()
    first = q.popleft()
    return list(q), last, first


@cases((A,))
def counter_ops(a):
    c = collections.Counter("abcab")
    return a * c["a"] + c["c"]


@cases((A, B))
def set_ops(a, b):
    s = {1, 2, 3}
    s.add(4)
    s.discard(1)
    u = s | {9}
    return a * len(s) + (4 in s) + len(u) + len(s & {2, 3})


@cases((A,))
def frozenset_membership(a):
    allowed = frozenset({"relu", "tanh"})
    return torch.relu(a) if "relu" in allowed else a


@cases((A, B))
def namedtuple_fields(a, b):
    p = Pair(a, b)
    return p.first * p.second, p[0], p._replace(second=a)


@cases((A, B))
def namedtuple_subclass(a, b):
    p = Point(a, b)
    return p.x - p.y, len(p)


@cases((A,))
def dataclass_field_read(a):
    box = Box(a, 3.0)
    return box.value * box.scale


@cases((A,))
def dataclass_field_write(a):
    box = Box(a)
    box.scale = 4.0
    box.value = box.value + 1
    return box.value * box.scale


@cases((A,))
def enum_value(a):
    return a * Color.GREEN.value + (Color.RED is Color.RED)


@cases((A,))
def enum_branch(a):
    mode = Color.RED
    return a + 1 if mode == Color.RED else a - 1


@cases((Box(A, 2.0),))
def dataclass_argument(box):
    return box.value * box.scale


@cases((Pair(A, B),))
def namedtuple_argument(p):
    return p.first + p.second


# --- comprehensions and loops --------------------------------------------------------------------------------


@cases((A,))
def list_comprehension(a):
    return [a * i for i in range(3)]


@cases((A,))
def comprehension_with_condition(a):
    return [a + i for i in range(6) if i % 2 == 0]


@cases((A, B))
def nested_comprehension(a, b):
    return [[x * y for y in (a, b)] for x in (a, b)]


@cases((A,))
def set_comprehension_constants(a):
    s = {i % 3 for i in range(10)}
    return a * len(s)


@cases((A, B))
def generator_expression_sum(a, b):
    return sum(x * 2 for x in (a, b))


@cases((A,))
def while_loop_constant_bound(a):
    i = 0
    while i < 4:
        a = a * 0.5
        i += 1
    return a


@cases((A,))
def for_with_break_and_else(a):
    for i in range(10):
        if i == 3:
            break
        a = a + i
    else:
        a = a * 100
    return a


@cases((A,))
def for_continue(a):
    for i in range(5):
        if i % 2:
            continue
        a = a - i
    return a


@cases((A, B))
def itertools_product(a, b):
    return [x * y for x, y in itertools.product([a, b], [1, 2])]


@cases((A, B))
def itertools_chain(a, b):
    return list(itertools.chain([a], [b, a + b]))


@cases((A,))
def itertools_combinations(a):
    return [a * (i + j) for i, j in itertools.combinations(range(4), 2)]


@cases((A, B))
def itertools_accumulate(a, b):
    return list(itertools.accumulate([a, b, a]))


@cases((A,))
def itertools_count_islice(a):
    return [a + n for n in itertools.islice(itertools.count(5), 3)]


@cases((A, B))
def itertools_zip_longest(a, b):
    return [x if y is None else x + y for x, y in itertools.zip_longest([a, b, a], [b])]


@cases((A,))
def operator_module_functions(a):
    return operator.mul(a, 2), operator.neg(a), operator.getitem([a, 1], 0), operator.itemgetter(1)([0, a])


@cases((A,))
def operator_attrgetter(a):
    return operator.attrgetter("shape")(a), a.sum()


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_container_case_matches_eager(fn, calls, options):
    check(fn, *calls, **options)
