"""Other Python features: user-defined dunders, walrus, del, try/finally without a break,
match statements, OrderedDict, enum, nested classes' attributes, chained methods on constants."""
import collections
import enum

import pytest

from support.capture import check, t


class Vec:
    def __init__(self, data):
        self.data = data

    def __add__(self, other):
        return Vec(self.data + other.data)

    def __mul__(self, k):
        return Vec(self.data * k)

    def __len__(self):
        return self.data.shape[0]

    def __getitem__(self, i):
        return self.data[i]

    def __call__(self, x):
        return self.data * x


def dunders(x):
    a = Vec(x)
    b = Vec(x * 2)
    c = (a + b) * 3
    return c.data, len(c), c[0], c(x)


def walrus(x):
    if (n := x.shape[0]) > 2:
        return x * n
    return x


def del_local(x):
    y = x * 2
    z = y + 1
    del y
    return z


def try_finally(x):
    try:
        y = x * 2
    finally:
        y = y + 1
    return y


def try_except_no_raise(x):
    try:
        y = x.sin()
    except ValueError:
        y = x
    else:
        y = y * 2
    return y


def match_statement(x, kind):
    match kind:
        case "double":
            return x * 2
        case ("scale", k):
            return x * k
        case _:
            return x - 1


class Mode(enum.Enum):
    A = 1
    B = 2


def enum_branch(x, mode):
    if mode is Mode.A:
        return x + mode.value
    return x * mode.value


def ordered_dict(x):
    d = collections.OrderedDict()
    d["a"] = x
    d["b"] = x * 2
    return d["a"] + d["b"], list(d.keys())


def constant_string_methods(x):
    name = "layer.0.weight"
    parts = name.rsplit(".", 1)
    idx = int(name.split(".")[1])
    return x * idx + len(parts[0]), name.title(), name.strip("l"), name.find("0")


def chained_conditional_expr(x, a):
    return x * (1 if a > 5 else 2 if a > 2 else 3)


def global_function_default_args(x):
    return _scale(x) + _scale(x, factor=4)


def _scale(v, factor=2):
    return v * factor


def lambda_sorted_key_constant(x):
    pairs = [(3, "c"), (1, "a"), (2, "b")]
    pairs = sorted(pairs)
    return x * pairs[0][0], [p[1] for p in pairs]


def nested_tuple_unpack_in_for(x):
    total = x * 0
    for i, (a, b) in enumerate([(1, 2), (3, 4)]):
        total = total + a * b * i
    return total


def tuple_of_tensors_index_by_shape(x):
    options = (x, x * 2, x * 3)
    return options[x.dim()]


def augmented_subscr(x):
    d = {"k": x}
    d["k"] += 1
    xs = [x, x]
    xs[1] *= 3
    return d["k"], xs


def bool_ops_return_values(x, y):
    a = y or x
    b = None and x
    c = 0 or None
    return a * 1, b, c


def unpack_dict_keys(x):
    a, b = {"p": 1, "q": 2}
    return x * len(a + b)


def star_unpack_in_call_with_shape(x):
    return x.new_zeros(*x.shape[:1], 2)


def print_free_formatting(x):
    msg = "size %d" % x.shape[0]
    return x * len(msg), msg


CASES = [
    (dunders, (t(3, grad=True),)),
    (walrus, (t(3),)),
    (del_local, (t(3),)),
    (try_finally, (t(3, grad=True),)),
    (try_except_no_raise, (t(3),)),
    (enum_branch, (t(3), Mode.A)),
    (enum_branch, (t(3), Mode.B)),
    (ordered_dict, (t(3),)),
    (constant_string_methods, (t(3),)),
    (chained_conditional_expr, (t(3), 7)),
    (chained_conditional_expr, (t(3), 3)),
    (chained_conditional_expr, (t(3), 1)),
    (global_function_default_args, (t(3),)),
    (lambda_sorted_key_constant, (t(3),)),
    (nested_tuple_unpack_in_for, (t(3),)),
    (tuple_of_tensors_index_by_shape, (t(3),)),
    (augmented_subscr, (t(3),)),
    (bool_ops_return_values, (t(3), None)),
    (unpack_dict_keys, (t(3),)),
    (star_unpack_in_call_with_shape, (t(3, 4),)),
    (print_free_formatting, (t(3),)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_misc_one_graph(fn, args):
    check(fn, *args, graphs=1, records=1, fullgraph=True)


@pytest.mark.parametrize("kind", ["double", ("scale", 5), "other"], ids=["value", "sequence", "default"])
def test_match_statement_matches_eager(kind):
    """Structural pattern matching (MATCH_SEQUENCE, ...) is not interpreted: it runs natively, correctly."""
    check(match_statement, t(3), kind)
