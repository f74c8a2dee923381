"""Python semantics inside compiled code (issue 21, class 5): identity, callable(), builtins on every kind of
value, list and set aliasing, and what a compiled function writes into Python state.

Each case runs eager and kiln side by side (`check`: same outputs and inputs after the call, and no recompile on
fresh inputs); `graphs` is the count torch.compile gives on the same function.
"""
import collections
import collections.abc as abc
import math
from typing import NamedTuple

import pytest
import torch

import kiln
from kiln.api import context_of
from support.capture import check, graph_count, t

# --- identity: an op that returns its argument returns the same object ---------------------------------------

def add_inplace_is_self(x):
    y = x.add_(1)
    return y is x, y is not x, y


def chained_inplace_on_intermediate(x):
    a = x * 2
    b = a.add_(1).mul_(3)
    return b is a, a


def out_argument_is_returned(x, out):
    r = torch.add(x, 1, out=out)
    return r is out, out


def augmented_assignment_keeps_identity(x):
    y = x
    y += 1
    return y is x, x


def no_op_conversions_return_self(x):
    return x.contiguous() is x, x.to(torch.float32) is x, x.t().contiguous() is x, x.view_as(x) is x


def functional_inplace_is_self(x):
    return torch.relu_(x) is x, x


@pytest.mark.parametrize("fn, args, graphs", [
    (add_inplace_is_self, (t(3),), 1),
    (chained_inplace_on_intermediate, (t(3),), 1),
    (out_argument_is_returned, (t(3), t(3)), 1),
    (augmented_assignment_keeps_identity, (t(3),), 1),
    (no_op_conversions_return_self, (t(3, 2),), 1),
    (functional_inplace_is_self, (t(3),), 1),
], ids=lambda v: getattr(v, "__name__", None))
def test_an_op_returning_its_argument_returns_the_same_object(fn, args, graphs):
    check(fn, *args, graphs=graphs)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_inplace_identity_under_the_autograd_backends(backend):
    x = t(3)
    compiled = kiln.compile(add_inplace_is_self, backend=backend)
    expected = add_inplace_is_self(x.clone())
    got = compiled(x)
    assert got[:2] == expected[:2] and got[2] is x
    torch.testing.assert_close(x, expected[2])


def is_between_inputs(a, b):
    return a is b, a is not b, a + 1


def test_identity_between_inputs_is_guarded_both_ways():
    compiled = kiln.compile(is_between_inputs, backend="eager")
    x, y = t(2), t(2)
    assert compiled(x, y)[:2] == (False, True)
    assert compiled(x, x)[:2] == (True, False)  # recompiled: the inputs are one object now
    assert compiled(y, x)[:2] == (False, True)
    assert graph_count(context_of(compiled)) == 2


def is_between_lists(a, b):
    a.append(1)
    return a is b, len(b)


def test_identity_between_input_lists_is_guarded():
    compiled = kiln.compile(is_between_lists, backend="eager")
    assert compiled([0], [0]) == is_between_lists([0], [0]) == (False, 1)
    shared, expected = [0], [0]
    assert compiled(shared, shared) == is_between_lists(expected, expected) == (True, 2)
    assert shared == expected


# --- callable() ------------------------------------------------------------------------------------------------

class WithCall:
    def __call__(self):
        return 1


class WithoutCall:
    pass


class InheritsCall(WithCall):
    pass


def plain_function():
    return 1


def callables(x, *objs):
    return x, [callable(o) for o in objs]


CALLABLE_CASES = {
    "instance with __call__": WithCall(), "instance without": WithoutCall(), "inherited __call__": InheritsCall(),
    "class": WithoutCall, "function": plain_function, "lambda": lambda: 1, "builtin": len, "math": math.sqrt,
    "module": math, "bound method": WithCall().__call__, "nn.Module": torch.nn.ReLU(), "torch function": torch.relu,
    "None": None, "int": 3, "str": "s", "list": [1], "dict": {"a": 1}, "type": type, "tensor": torch.ones(1),
}


@pytest.mark.parametrize("name", list(CALLABLE_CASES))
def test_callable_of_an_input(name):
    obj = CALLABLE_CASES[name]
    compiled = kiln.compile(callables, backend="eager")
    assert compiled(torch.ones(1), obj)[1] == callables(torch.ones(1), obj)[1]


def callables_made_inside(x):
    return [callable(v) for v in (WithCall(), WithoutCall(), x, x.add, lambda: 0, len, int, [], {}, InheritsCall,
                                  [].append, collections.OrderedDict())]


def test_callable_of_values_made_inside():
    check(callables_made_inside, t(1), graphs=0)


def test_callable_over_many_kinds_in_one_loop_past_the_cache_limit():
    """Each kind recompiles the loop's continuation; past the cache limit the rest steps natively, and
    what it folds must hold for every object (it folded `callable` of the first one it saw)."""
    objs = list(CALLABLE_CASES.values()) * 2
    compiled = kiln.compile(callables, backend="eager")
    assert compiled(torch.ones(1), *objs)[1] == callables(torch.ones(1), *objs)[1]


# --- dicts: OrderedDict, defaultdict, views, operators ------------------------------------------------------

def defaultdict_of_lists(x):
    d = collections.defaultdict(list)
    d["a"].append(x)
    d["b"].append(x + 1)
    d["a"].append(x * 2)
    return d, d.default_factory, len(d), "c" in d, d.get("c")


def defaultdict_counter(x):
    d = collections.defaultdict(int)
    for k in "abca":
        d[k] += 1
    return d, x * d["a"]


def defaultdict_with_a_lambda(x):
    d = collections.defaultdict(lambda: x * 2)
    return d["k"], len(d)


def ordered_move_to_end(x):
    o = collections.OrderedDict()
    o["x"], o["y"], o["z"] = 1, 2, 3
    o.move_to_end("x")
    o.move_to_end("z", last=False)
    return o, list(o.keys()), x


def ordered_popitem(x):
    o = collections.OrderedDict(a=1, b=2, c=3)
    last, first = o.popitem(), o.popitem(last=False)
    d = {"a": 1, "b": 2}
    return last, first, o, d.popitem(), x


def ordered_equality(x):
    a = collections.OrderedDict([("a", 1), ("b", 2)])
    b = collections.OrderedDict([("b", 2), ("a", 1)])
    return a == b, a != b, a == dict(b), dict(a) == dict(b), {"a": x} == {"a": x}, {"a": 1} == {"a": 2}, x


def dict_merge_operators(x):
    d = {"a": 1}
    e = d | {"b": 2}
    d |= {"c": x}
    o = collections.OrderedDict(z=0) | {"a": 1}
    return d, e, o, type(o)


def dict_fromkeys(x):
    return dict.fromkeys(["a", "b"], 0), collections.OrderedDict.fromkeys("xy"), dict.fromkeys(range(2)), x


def dict_setdefault_and_update(x):
    d = {}
    v = d.setdefault("a", [])
    v.append(1)
    d.update([("b", 2)], c=3)
    d.update({"e": x})
    return d, d.setdefault("a", None)


def dict_copy_keeps_kind(x):
    o = collections.OrderedDict(b=1, a=2)
    c = o.copy()
    c["z"] = 0
    d = collections.defaultdict(list, k=[1]).copy()
    return o, c, type(c), d["new"], type(d), x


def dict_views(x):
    a, b = {"a": 1, "b": 2}, {"b": 3, "a": 4}
    return (a.keys() == b.keys(), a.items() == b.items(), sorted(a.keys() & {"a"}), sorted(a.keys() | {"c"}),
            a.keys() - {"a"}, list(a.values()), "a" in a.keys(), ("a", 1) in a.items(), len(a.items()),
            type(a.keys()) is type({}.keys()), x)


def dict_views_are_live(x):
    d = {"a": 1}
    keys = d.keys()
    d["b"] = 2
    return list(keys), len(keys), x


def dict_key_errors(x):
    d = {"a": 1}
    out = []
    for op in (lambda: d["b"], lambda: d.pop("b"), lambda: {}.popitem()):
        try:
            op()
        except KeyError:
            out.append(1)
    return x * len(out)


@pytest.mark.parametrize("fn, graphs", [
    (defaultdict_of_lists, 1),
    (defaultdict_counter, 1),
    (defaultdict_with_a_lambda, 1),
    (ordered_move_to_end, 0),
    (ordered_popitem, 0),
    (ordered_equality, 0),
    (dict_merge_operators, 0),
    (dict_fromkeys, 0),
    (dict_setdefault_and_update, 0),
    (dict_copy_keeps_kind, 0),
    (dict_views, 0),
    (dict_views_are_live, 0),
    (dict_key_errors, 1),
], ids=lambda v: getattr(v, "__name__", None))
def test_dict_kinds_keep_their_semantics(fn, graphs):
    check(fn, t(2), graphs=graphs)


def test_a_returned_defaultdict_keeps_its_factory():
    d = kiln.compile(defaultdict_of_lists, backend="eager")(t(2))[0]
    assert type(d) is collections.defaultdict and d.default_factory is list
    assert d["new"] == []  # the factory works on the rebuilt dict


def mutate_input_defaultdict(x, d):
    d["new"].append(x)
    d["old"].append(1)
    return d["new"], len(d)


def mutate_input_ordered_dict(x, o):
    o.move_to_end("a")
    o["z"] = x
    first = o.popitem(last=False)
    return o, first


def test_an_input_defaultdict_calls_its_factory_and_is_mutated_in_place():
    x = t(2)
    eager_d, kiln_d = collections.defaultdict(list, old=[0]), collections.defaultdict(list, old=[0])
    expected = mutate_input_defaultdict(x, eager_d)
    got = kiln.compile(mutate_input_defaultdict, backend="eager")(x, kiln_d)
    assert got[1] == expected[1] and got[0][0] is x
    assert list(kiln_d) == list(eager_d) and kiln_d["old"] == eager_d["old"] and kiln_d.default_factory is list


def test_an_input_ordered_dict_is_reordered_in_place():
    x = t(2)
    eager_o, kiln_o = collections.OrderedDict(a=1, b=2, c=3), collections.OrderedDict(a=1, b=2, c=3)
    expected = mutate_input_ordered_dict(x, eager_o)
    got = kiln.compile(mutate_input_ordered_dict, backend="eager")(x, kiln_o)
    assert got[0] is kiln_o and got[1] == expected[1]
    assert list(kiln_o.items()) == list(eager_o.items()) == [("c", 3), ("a", 1), ("z", x)]


# --- builtins on every kind of value ---------------------------------------------------------------------------

class Pair(NamedTuple):
    a: int
    b: int


class Sized:
    def __len__(self):
        return 0


class Holder:
    def __init__(self):
        self.v = 1


def isinstance_forms(x, p):
    return (isinstance(x, (int, torch.Tensor)), isinstance(3, (str, float)), isinstance(True, int),
            isinstance({}, abc.Mapping), isinstance([], abc.Sequence), isinstance((), abc.Hashable),
            isinstance(x, abc.Iterable), isinstance(len, abc.Callable), isinstance(collections.OrderedDict(), dict),
            isinstance(Pair(1, 2), tuple), isinstance(p, torch.nn.Parameter), isinstance(x, torch.nn.Parameter),
            type(p) is torch.Tensor, type(True) is int, type(Pair(1, 2)) is Pair, x)


def hasattr_and_getattr_defaults(x, obj):
    return (hasattr([], "append"), hasattr([], "shape"), hasattr({}, "shape"), hasattr((1,), "shape"),
            hasattr({1}, "add"), hasattr({1}, "shape"), hasattr(x, "shape"), hasattr(x, "nope"),
            getattr(obj, "v", 5), getattr(obj, "w", 5), getattr([], "n", 1), getattr(x, "n", 2), x)


def truth_and_length(x):
    return (len([]), bool([]), bool([0]), bool({}), bool(""), bool(()), bool(0.0), bool(Sized()), bool(None),
            len("abc"), len({1: 2}), len(range(5)), x)


def membership(x):
    return ("a" in {"a": 1}, 1 in {1, 2}, 3 in [1, 2], "b" in "abc", (1, 2) in [(1, 2)], 2 in range(3),
            None in [None], x)


def number_conversions(x):
    return (int(3.9), int(-3.9), int("12"), int(True), float("1.5"), float(2), bool(2), int(" 7 "), round(2.5),
            round(3.14159, 2), abs(-3), divmod(-7, 2), int("ff", 16), -7 // 2, -7 % 3, 2 ** -1, True + True, x)


def containers_compare(x):
    return ([1, 2] == [1, 2], (1, 2) == [1, 2], {1, 2} == {2, 1}, [x] == [x], [] is [], {} == {}, [1] != [1],
            (1, 2) < (1, 3), [1, 2] < [1, 3], Pair(1, 2) == (1, 2), x)


@pytest.mark.parametrize("fn, args", [
    (isinstance_forms, (t(2), torch.nn.Parameter(torch.ones(2)))),
    (hasattr_and_getattr_defaults, (t(2), Holder())),
    (truth_and_length, (t(2),)),
    (membership, (t(2),)),
    (number_conversions, (t(2),)),
    (containers_compare, (t(2),)),
], ids=lambda v: getattr(v, "__name__", None))
def test_builtins_answer_as_python_does(fn, args):
    check(fn, *args, graphs=0)


# --- aliasing: a list or set is one object wherever it is seen -----------------------------------------------

def list_inplace_operators_mutate(x):
    a = [1]
    b = a
    a += [2]
    a *= 2
    return b, a is b, x


def set_inplace_operators_mutate(x):
    s = {1, 2}
    t_ = s
    s |= {3}
    s -= {1}
    return t_, s is t_, x


def input_list_mutations(x, xs):
    xs.insert(0, 9)
    xs.extend([3, 4])
    xs.remove(3)
    xs.append(x)
    xs.pop(0)
    xs[0] = 7
    del xs[1]
    xs += [5]
    return len(xs)


def input_list_slices(x, xs):
    xs[1:2] = [8, 8]
    xs *= 2
    return len(xs), x


def one_list_in_two_places(x):
    shared = [x]
    pair = [shared, shared]
    return pair, (shared, shared)


def nested_list_in_an_input_dict(x, d):
    d["l"].append(1)
    d["l"][0] = 5
    return x


@pytest.mark.parametrize("fn, args", [
    (list_inplace_operators_mutate, (t(2),)),
    (set_inplace_operators_mutate, (t(2),)),
    (input_list_mutations, (t(2), [5, 2])),
    (input_list_slices, (t(2), [1, 2, 3])),
    (nested_list_in_an_input_dict, (t(2), {"l": [1, 2]})),
], ids=lambda v: getattr(v, "__name__", None))
def test_list_and_set_mutations_are_seen_through_every_alias(fn, args):
    check(fn, *args, graphs=0, second=False)


def test_one_list_stays_one_object_when_returned_twice():
    pair, tup = kiln.compile(one_list_in_two_places, backend="eager")(t(2))
    assert pair[0] is pair[1] and tup[0] is tup[1] and pair[0] is tup[0]


def returns_new_lists(x):
    return x, [1] + [2], "a,b".split(","), list(range(2)) * 2, {"k": [1]}


def test_folded_lists_are_new_objects_on_every_call():
    compiled = kiln.compile(returns_new_lists, backend="eager")
    first, second = compiled(t(2)), compiled(t(2))
    for a, b in zip(first[1:], second[1:]):
        assert a == b and a is not b
    assert first[4]["k"] is not second[4]["k"]


# --- Python state written by compiled code holds plain Python values -----------------------------------------

STATE = {}


class Box:
    pass


BOX = Box()


def sizes_into_python_state(a, out):
    STATE["shape"] = tuple(a.shape)
    STATE["n"] = a.shape[0] * 2 + 1
    STATE["half"] = a.shape[0] / 2
    STATE["big"] = a.shape[0] > 3
    STATE["dims"] = list(a.shape)
    BOX.size = a.size(0)
    out.append(a.numel())
    return a + 1, a.shape[0], a.size(), {"n": a.shape[0] // 2}


def _plain(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    return isinstance(value, torch.Tensor) or type(value) in (int, float, bool, torch.Size)


@pytest.mark.parametrize("dynamic", [None, True])
def test_sizes_written_to_python_state_are_plain_numbers(dynamic):
    compiled = kiln.compile(sizes_into_python_state, backend="eager", dynamic=dynamic)
    for n in (3, 5, 6, 7):
        out = []
        result = compiled(torch.ones(n, 4), out)
        assert _plain(result) and _plain(STATE) and _plain(out) and type(BOX.size) is int
        expected_state, expected_out = dict(STATE), list(out)
        sizes_into_python_state(torch.ones(n, 4), out := [])
        assert expected_state == STATE and expected_out == out
    assert graph_count(context_of(compiled)) <= 2


def defaultdict_of_a_non_callable(x):
    return collections.defaultdict(3), x


def test_a_defaultdict_of_a_non_callable_raises_as_eager():
    with pytest.raises(TypeError):
        defaultdict_of_a_non_callable(t(2))
    with pytest.raises(TypeError):
        kiln.compile(defaultdict_of_a_non_callable, backend="eager")(t(2))
