"""Resuming after a graph break with live state of every kind on the stack and in locals:
iterators, zips, enumerate, modules, dicts, closures, grad mode, partial loops, kwargs."""
import pytest
import torch
import torch.nn as nn

import kiln
from support.capture import check, check_module, t

G_LIST = []


def break_in_zip_loop(xs, ys):
    out = []
    for a, b in zip(xs, ys):
        c = a * b
        print(c.shape)
        out.append(c + 1)
    return out


def break_in_enumerate_loop(xs):
    total = xs[0] * 0
    for i, x in enumerate(xs):
        total = total + x * i
        kiln.graph_break()
    return total


def break_with_dict_live(x):
    d = {"a": x * 2, "n": 3}
    kiln.graph_break()
    d["b"] = d["a"] + d["n"]
    return d


def break_with_closure_live(x):
    k = x * 3

    def f(v):
        return v + k

    kiln.graph_break()
    return f(x)


def break_with_nonlocal_write(x):
    acc = x * 1

    def bump(v):
        nonlocal acc
        acc = acc + v

    bump(x)
    kiln.graph_break()
    bump(x * 2)
    return acc


def break_in_call_with_kwargs(x):
    def g(a, *, b, c=1.0):
        print("g")
        return a * b + c

    return g(x, b=2.0, c=x)


def break_in_star_call(x):
    def g(*args, **kwargs):
        kiln.graph_break()
        return sum(args) + kwargs["z"]

    args = (x, x * 2)
    return g(*args, z=x * 3)


def break_reads_global_written_before(x):
    global G_SCALE
    G_SCALE = 4.0
    kiln.graph_break()
    return x * G_SCALE


G_SCALE = 1.0


def break_inplace_input_then_read(x):
    x.mul_(2)
    kiln.graph_break()
    return x + 1


def break_same_tensor_twice(x):
    y = x * 2
    kiln.graph_break()
    return y, y


def break_while_loop(x):
    i = 0
    while i < 3:
        x = x + 1
        kiln.graph_break()
        i += 1
    return x


def break_in_nested_loops(x):
    for _i in range(2):
        for j in range(2):
            x = x * 1.5
            if j == 1:
                kiln.graph_break()
    return x


def break_in_comprehension(xs):
    return [x.sum().item() for x in xs]


def break_returns_generator_sum(xs):
    return sum(x.max().item() for x in xs)


def break_with_tuple_return_and_none(x):
    a = None
    b = (x, 1, "s")
    kiln.graph_break()
    return a, b


def break_nested_no_grad(x):
    def inner(v):
        with torch.no_grad():
            w = v * 2
            kiln.graph_break()
            return w + 1

    return inner(x), x * 2


def break_then_break_in_callee(x):
    def inner(v):
        kiln.graph_break()
        return v + 1

    y = inner(x)
    kiln.graph_break()
    return inner(y)


def break_inside_if_on_shape(x):
    if x.shape[0] > 1:
        kiln.graph_break()
        x = x * 2
    else:
        x = x * 3
    return x


def break_slices_and_negative(x):
    parts = [x[i] for i in range(x.shape[0])]
    kiln.graph_break()
    return parts[-1] - parts[0], parts[1:]


CASES = [
    (break_in_zip_loop, ([t(2), t(2)], [t(2), t(2)])),
    (break_in_enumerate_loop, ([t(2, grad=True), t(2), t(2)],)),
    (break_with_dict_live, (t(3),)),
    (break_with_closure_live, (t(3, grad=True),)),
    (break_with_nonlocal_write, (t(3),)),
    (break_in_call_with_kwargs, (t(3),)),
    (break_in_star_call, (t(3, grad=True),)),
    (break_reads_global_written_before, (t(3),)),
    (break_inplace_input_then_read, (t(3),)),
    (break_same_tensor_twice, (t(3),)),
    (break_while_loop, (t(3, grad=True),)),
    (break_in_nested_loops, (t(3),)),
    (break_with_tuple_return_and_none, (t(3),)),
    (break_nested_no_grad, (t(3, grad=True),)),
    (break_then_break_in_callee, (t(3, grad=True),)),
    (break_inside_if_on_shape, (t(3),)),
    (break_inside_if_on_shape, (t(1),)),
    (break_slices_and_negative, (t(3, 2, grad=True),)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_resume_matches_eager(fn, args, capsys):
    check(fn, *args)


@pytest.mark.parametrize("fn", [break_in_comprehension, break_returns_generator_sum], ids=lambda f: f.__name__)
def test_resume_item_in_comprehension(fn):
    c = kiln.compile(fn, backend="eager")
    for _ in range(2):
        xs = [t(3), t(3)]
        assert c(xs) == pytest.approx(fn(xs))


def test_same_tensor_twice_is_one_object():
    c = kiln.compile(break_same_tensor_twice, backend="eager")
    a, b = c(t(3))
    assert a is b


def test_return_input_is_same_object():
    def f(x, y):
        kiln.graph_break()
        return x, y * 1

    c = kiln.compile(f, backend="eager")
    x = t(3)
    assert c(x, x)[0] is x


class LoopPrint(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i == 1:
                kiln.graph_break()
        return self.norm(x)


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = LoopPrint()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.inner(x).relu())


@pytest.mark.parametrize("make", [LoopPrint, Outer], ids=lambda m: m.__name__)
def test_module_break_in_loop(make):
    check_module(make, t(2, 4, grad=True))


def test_random_ops_match_eager_rng():
    def f(x):
        a = torch.rand(3)
        b = torch.randn_like(x)
        d = torch.nn.functional.dropout(x, 0.5, training=True)
        return x + a + b, d

    c = kiln.compile(f, backend="eager")
    x = t(3)
    torch.manual_seed(123)
    expected = f(x)
    torch.manual_seed(123)
    actual = c(x)
    for e, a in zip(expected, actual):
        torch.testing.assert_close(a, e)


def test_rng_across_break():
    def f(x):
        a = torch.randn(3)
        kiln.graph_break()
        return x + a + torch.randn(3)

    c = kiln.compile(f, backend="eager")
    x = t(3)
    torch.manual_seed(5)
    e = f(x)
    torch.manual_seed(5)
    torch.testing.assert_close(c(x), e)


def after_break_import_and_opaque(x):
    y = x * 2
    kiln.graph_break()
    import numpy as np
    arr = np.arange(4)
    first, *rest = arr
    both = [*arr, 5]
    head = list(arr)[1:3]
    d = {}
    d.update({"k": arr})
    return y + float(first) + len(rest) + len(both) + len(head) + len(d)


def after_break_match(x, kind):
    y = x + 1
    kiln.graph_break()
    match kind:
        case (a, b):
            return y * a * b
        case _:
            return y


@pytest.mark.parametrize("fn,args", [
    # the continuation calls numpy: a fallback (torch.compile traces numpy), exercised on purpose
    pytest.param(after_break_import_and_opaque, (t(3),), marks=pytest.mark.allows_fallback("graph_break: numpy")),
    (after_break_match, (t(3), (2, 3))),
    (after_break_match, (t(3), "x")),
], ids=["import_and_opaque", "match_pair", "match_default"])
def test_continuations_run_unmodelled_instructions_natively(fn, args):
    check(fn, *args)


def break_inside_map_lambda(xs):
    vals = list(map(lambda v: v.sum().item(), xs))
    return xs[0] * len(vals), vals


def break_inside_sorted_key(xs):
    ordered = sorted(xs, key=lambda v: v.sum().item())
    return torch.stack(ordered)


def break_in_property(x):
    class Lazy:
        def __init__(self, t):
            self.t = t

        @property
        def total(self):
            return self.t.sum().item()

    return x * Lazy(x).total


@pytest.mark.parametrize("fn,args", [
    (break_inside_map_lambda, ([t(2), t(2)],)),
    (break_inside_sorted_key, ([t(2), t(2), t(2)],)),
    (break_in_property, (t(3),)),
], ids=["map_lambda", "sorted_key", "property"])
def test_breaks_inside_callbacks(fn, args):
    check(fn, *args, second=False)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("use", ["x + missing_name", "missing_name(x)", "missing_name.attr"])
def test_a_missing_global_after_a_break_raises_eagers_name_error(use, backend):
    """A continuation has no frame to run eagerly: the global lookup runs natively in its program, which
    raises Python's NameError after the effects before it (not kiln's "cannot resume")."""
    namespace = {"torch": torch, "LOG": []}
    exec(f"def f(x):\n    LOG.append(1)\n    print('break')\n    LOG.append(2)\n    return {use}\n", namespace)
    with pytest.raises(NameError) as eager_error:
        namespace["f"](torch.ones(2))
    namespace["LOG"].clear()
    with pytest.raises(NameError) as kiln_error:
        kiln.compile(namespace["f"], backend=backend)(torch.ones(2))
    assert str(kiln_error.value) == str(eager_error.value) and namespace["LOG"] == [1, 2]
